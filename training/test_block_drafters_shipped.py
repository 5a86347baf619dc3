#!/usr/bin/env python3
"""The DFLASH and DSPARK drafters shipped in heads/ on the shipped prompts (CTest: block_drafters_shipped),
greedy and deterministic:

  for each of DFLASH and DSPARK, `specactor config` with no draft path must resolve to the shipped
  drafter (override source auto.shipped_drafter) with its measured shape from its config.json; then
  `specactor bench` at that shape, drafted whole every step (--speculative-adaptive false: this
  measures the drafter, the budget would verify less where it does not pay), one round; checks
  - every output equals plain greedy decoding,
  - the mean accepted length over the shipped prompts >= MIN_TAU (argv[3], default 2.0),
  - the run reports the drafter's block size and acceptance by position.
Speeds are printed, never asserted.

    python3 training/test_block_drafters_shipped.py BUILD_DIR MODEL.gguf [MIN_TAU]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def main():
    ap = argparse.ArgumentParser(description="the shipped DFLASH and DSPARK drafters on the shipped prompts")
    ap.add_argument("build", help="the build folder (holds specactor)")
    ap.add_argument("model", help="the default model's GGUF")
    ap.add_argument("min_tau", type=float, nargs="?", default=2.0, help="the least τ over the shipped prompts")
    a = ap.parse_args()
    spec, model, min_tau = os.path.join(a.build, "specactor"), a.model, a.min_tau
    if not os.path.isfile(model):
        ap.error(f"the model {model} is missing (run tools/setup)")
    for algo, folder in (("DFLASH", "SmolLM2-135M-Instruct-dflash"), ("DSPARK", "SmolLM2-135M-Instruct-dspark")):
        shipped = json.load(open(os.path.join(ROOT, "heads", folder, "config.json")))["specactor"]["defaults"]
        cfg = subprocess.run([spec, "config", "--model-path", model, "--speculative-algorithm", algo],
                             capture_output=True, text=True)
        if cfg.returncode != 0:
            fail(f"specactor config ({algo}): {cfg.stderr.strip()}")
        target = json.loads(cfg.stdout)["target"]
        resolved = target["settings"]
        if "auto.shipped_drafter" not in cfg.stdout or not resolved["speculative_draft_model_path"].endswith(folder):
            fail(f"{algo} alone does not resolve to heads/{folder}:\n" + cfg.stdout[-2000:])
        for key in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                    "speculative_draft_ngram_tokens", "speculative_draft_quantization"):
            if resolved[key] != shipped[key]:
                fail(f"{algo}: {key} resolved to {resolved[key]!r}, the shipped config.json says {shipped[key]!r}")
        print(f"ok: --speculative-algorithm {algo} alone resolves to heads/{folder} and its measured shape")
        p = subprocess.run([spec, "bench", "--model-path", model, "--speculative-algorithm", algo,
                            "--speculative-adaptive", "false", "--prompts",
                            os.path.join(ROOT, "cli", "bench_prompts.jsonl"), "--max-new-tokens", "64", "--repeats",
                            "1", "--concurrency", "0", "--json", "--threads", "2"], capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"specactor bench ({algo}) exited {p.returncode}: {p.stderr[-3000:]}")
        s = json.loads(p.stdout)["settings"][0]
        for name, c in sorted(s["by_category"].items()):
            print(f"{algo}: {name}: τ {c['mean_tau']:.2f}, speedup {c['median_speedup']:.2f}x (timing, not checked)")
        if not s["outputs_identical_to_plain"]:
            fail(f"{algo}: {s['mismatched_prompts']} outputs differ from plain greedy decoding")
        print(f"ok: {algo}: every output equals plain greedy decoding")
        drafter = s.get("drafter") or {}
        if drafter.get("block_size") != 8 or len(s.get("acceptance_by_position") or []) < 3:
            fail(f"{algo}: the run does not report the block size (8) and acceptance by position: {drafter}, "
                 f"{s.get('acceptance_by_position')}")
        print(f"ok: {algo}: block size {drafter['block_size']}, acceptance by position "
              f"{[round(x, 2) for x in s['acceptance_by_position']]}")
        tau = s["mean_tau"]
        if tau < min_tau:
            fail(f"{algo}: τ over the shipped prompts is {tau:.2f}, expected at least {min_tau}")
        print(f"ok: {algo}: τ over the shipped prompts {tau:.2f} >= {min_tau}")
    print("block_drafters_shipped: all checks passed")


if __name__ == "__main__":
    main()
