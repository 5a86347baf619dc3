#!/usr/bin/env python3
"""The shipped EAGLE-3 head on the shipped prompts (CTest: eagle3_head), greedy and deterministic:

  `specactor bench --speculative-algorithm EAGLE3` with no draft path (so the shipped head is the
  default, as the config's override log must say), one round, first with the head's default setting
  (its tree, path-probability floor and Q4_1 weights, the default float16 KV cache), then with a chain
  of 3 drafts on a float32 KV cache (the texts the bar was set on); checks
  - every output equals plain greedy decoding, in both runs,
  - τ on the chat prompts >= MIN_TAU (argv[3], default 2.0) at the chain of 3, drafted whole every step
    (--speculative-adaptive false: this measures the head; the budget would verify less where it does
    not pay).
Speeds are printed, never asserted.

    python3 training/test_eagle3_head.py BUILD_DIR MODEL.gguf [MIN_TAU]
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    build, model = sys.argv[1], sys.argv[2]
    min_tau = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    spec = os.path.join(build, "specactor")
    if not os.path.isfile(model):
        sys.exit(f"test_eagle3_head: error: the model {model} is missing (run tools/setup)")
    cfg = subprocess.run([spec, "config", "--model-path", model, "--speculative-algorithm", "EAGLE3"],
                         capture_output=True, text=True)
    if cfg.returncode != 0:
        sys.exit(f"FAILED: specactor config: {cfg.stderr.strip()}")
    if "auto.shipped_head" not in cfg.stdout:
        sys.exit("FAILED: the override log does not name auto.shipped_head:\n" + cfg.stdout[-2000:])
    print("ok: --speculative-algorithm EAGLE3 alone resolves to the shipped head (override source auto.shipped_head)")
    for label, shape in (("default setting", []),
                         # The τ bar was set (and the head trained) on the float32 KV cache's greedy texts;
                         # the float16 default changes a few close calls and so the texts of these four chat
                         # prompts (chat τ 1.98 there, 2.05 with float32, 2026-12-03), while on the 48
                         # held-out prompts its τ is no lower (1.62 vs 1.58): the bar is checked on the same
                         # texts as before.
                         ("chain of 3", ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                         "--speculative-adaptive", "false", "--kv-cache-dtype", "float32"])):
        p = subprocess.run([spec, "bench", "--model-path", model, "--speculative-algorithm", "EAGLE3", *shape,
                            "--prompts", os.path.join(ROOT, "cli", "bench_prompts.jsonl"), "--max-new-tokens", "64",
                            "--repeats", "1", "--json", "--threads", "2"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"FAILED: specactor bench ({label}) exited {p.returncode}: {p.stderr[-3000:]}")
        j = json.loads(p.stdout)
        s = j["settings"][0]
        cats = s["by_category"]
        for name, c in sorted(cats.items()):
            print(f"{label}: {name}: τ {c['mean_tau']:.2f}, speedup {c['median_speedup']:.2f}x (timing, not checked)")
        if not s["outputs_identical_to_plain"]:
            sys.exit(f"FAILED: {label}: {s['mismatched_prompts']} outputs differ from plain greedy decoding")
        print(f"ok: {label}: every output equals plain greedy decoding")
    tau = cats["chat"]["mean_tau"]
    if tau < min_tau:
        sys.exit(f"FAILED: τ on the chat prompts is {tau:.2f}, expected at least {min_tau}")
    print(f"ok: τ on the chat prompts {tau:.2f} >= {min_tau}")
    print("eagle3_head: all checks passed")


if __name__ == "__main__":
    main()
