#!/usr/bin/env python3
"""The DFlash and DSpark training recipes end to end on a tiny target (CTest: train_dflash), quick
enough for CI:

  a 2-block cut of the default model (`specactor shrink`) -> make-data (16 prompts) -> train_dflash.py
  for 16 steps (the logged loss must fall) -> the export has the published layout plus the draft
  vocabulary, loads in specactor (`inspect --target`) and drafts losslessly (`generate` with DFLASH
  equals plain greedy, with drafts made) -> `--resume` continues from the checkpoint, and refuses one made
  under another objective (--pos-decay) -> bad inputs
  (a missing data folder, a block size of 1, a mask token outside the vocabulary) each give one clear
  error and exit status 2 -> DSpark heads on the trained drafter's frozen backbone (--dspark --backbone
  --freeze-backbone, 12 steps): the loss falls, the held-out evaluation reports the confidence's
  calibration, the export is a DSparkDraftModel that keeps the backbone, loads and drafts losslessly with
  DSPARK; with --no-markov-first-row the first drafts are the backbone's; with --block-size 3 the heads train
  and export at a block of 3 -> the DSpark flags without --dspark, or a frozen backbone without one, are refused -> a drafter
  seeded from the target's layer (--init-from-target) has the target's weights with q/k rows in the
  drafter's RoPE order, trains and drafts losslessly; bad seeding flags are refused.

    .venv-train/bin/python training/test_train_dflash.py BUILD_DIR MODEL.gguf
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, expect=0):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != expect:
        sys.exit(f"FAILED: {' '.join(cmd)}\nexit {p.returncode}, expected {expect}\nstdout:\n{p.stdout[-3000:]}\n"
                 f"stderr:\n{p.stderr[-3000:]}")
    return p


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}", flush=True)


def generate(spec, model, prompt, extra):
    p = run([spec, "generate", "--model-path", model, "--prompt", prompt, "--chat", "--max-new-tokens", "24",
             "--log-level", "warn", "--json", *extra])
    return json.loads(p.stdout)


def dspark_checks(spec, trainer, tiny, data, backbone, tmp):
    out, work = os.path.join(tmp, "dspark"), os.path.join(tmp, "dspark-work")
    common = ["--data", data, "--out", out, "--work", work, "--dspark", "--backbone", backbone, "--freeze-backbone",
              "--markov-rank", "16", "--lr", "1e-2", "--log-every", "2", "--quiet", "--eval-share", "0.2"]
    run([*trainer, *common, "--max-steps", "12", "--epochs", "50"])
    hist = json.load(open(os.path.join(work, "history.json")))
    losses = [h["loss"] for h in hist if "loss" in h]
    check(len(losses) >= 5 and sum(losses[-2:]) < sum(losses[:2]),
          f"DSpark heads: the training loss falls ({losses[0]:.3f} -> {losses[-1]:.3f})")
    ev = next(h["eval"] for h in reversed(hist) if "eval" in h)
    check(ev.get("confidence") and 0 <= ev["confidence"]["ece"] <= 1,
          f"the held-out evaluation reports the confidence's calibration (error {ev['confidence']['ece']})")
    base_tau = json.load(open(os.path.join(backbone, "config.json")))["specactor"]["held_out"]["tau_est"]
    check(ev["tau_est"] >= base_tau, f"the Markov head does not lose held-out τ against its backbone "
                                     f"({base_tau} -> {ev['tau_est']}, the same held-out anchors)")
    cfg = json.load(open(os.path.join(out, "config.json")))
    check(cfg["architectures"] == ["DSparkDraftModel"] and cfg["dspark_config"]["markov_rank"] == 16
          and cfg["dspark_config"]["block_size"] == 4,
          "the export is a DSparkDraftModel (Markov rank 16, the backbone's block of 4)")
    from safetensors.numpy import load_file
    mine, base = load_file(os.path.join(out, "model.safetensors")), load_file(os.path.join(backbone, "model.safetensors"))
    check(all((mine[k] == v).all() for k, v in base.items()) and "markov_head.w1.weight" in mine,
          "a frozen backbone is exported unchanged, with the heads beside it")
    info = json.loads(run([spec, "inspect", out, "--target", tiny]).stdout)
    check(info["kind"] == "DSPARK" and info["markov_rank"] == 16, "specactor inspect --target loads it: DSPARK")
    drafted = 0
    for prompt in ("Name three colors.", "What is 12 times 7?"):
        plain = generate(spec, tiny, prompt, ["--speculative-algorithm", "NONE"])
        fast = generate(spec, tiny, prompt, ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path",
                                             out, "--speculative-adaptive", "false"])
        check(fast["tokens"] == plain["tokens"], f"DSPARK output equals plain greedy output for {prompt!r}")
        drafted += fast["speculative"]["drafted"]
    check(drafted > 0, f"the DSpark drafter drafted ({drafted} drafts)")
    def variant(suffix, flags, steps):
        """The same heads trained again into out+suffix with more flags: its config."""
        o, w = out + suffix, work + suffix
        run([*trainer, *[o if x == out else w if x == work else x for x in common], *flags, "--max-steps", steps,
             "--epochs", "50"])
        return o, json.load(open(os.path.join(o, "config.json")))

    def lossless(folder, what):
        args = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", folder,
                "--speculative-adaptive", "false"]
        plain = generate(spec, tiny, "Name three colors.", ["--speculative-algorithm", "NONE"])
        check(generate(spec, tiny, "Name three colors.", args)["tokens"] == plain["tokens"], what)

    # --no-markov-first-row: no Markov term on the first row, so (the backbone frozen) the first drafts
    # are the backbone's: the same held-out acceptance at position 1, to the anchor.
    out1, cfg1 = variant("-nofirst", ["--no-markov-first-row"], "6")
    base_first = json.load(open(os.path.join(backbone, "config.json")))["specactor"]["held_out"]["accepted_by_position"]
    mine_first = cfg1["specactor"]["held_out"]["accepted_by_position"]
    check(cfg1["dspark_config"]["markov_first_row"] is False and cfg["dspark_config"]["markov_first_row"] is True
          and mine_first[0] == base_first[0],
          f"--no-markov-first-row: the config says so and the first draft is the backbone's (held-out position 1 "
          f"accepted {mine_first[0]} = {base_first[0]})")
    lossless(out1, "a DSpark drafter without the first row's Markov term drafts losslessly")
    # --block-size with --backbone: the heads train on a shorter block than the backbone's (the engine's
    # pass of the root and one mask row per draft asked), and the export says so.
    out3, cfg3 = variant("-b3", ["--block-size", "3"], "4")
    check(cfg3["dspark_config"]["block_size"] == 3 and len(cfg3["specactor"]["held_out"]["accepted_by_position"]) == 2,
          f"--block-size 3 with --backbone (block 4): heads trained and exported at a block of 3 "
          f"(block_size {cfg3['dspark_config']['block_size']})")
    lossless(out3, "a DSpark drafter whose heads trained on a block of 3 drafts losslessly")
    base_args = ["--data", data, "--out", out, "--work", work]
    for args, want in (([*base_args, "--backbone", backbone], "--backbone: only applies with --dspark"),
                       ([*base_args, "--no-markov-first-row"], "--no-markov-first-row: only applies with --dspark"),
                       ([*base_args, "--dspark", "--freeze-backbone"], "--freeze-backbone: needs --backbone"),
                       ([*base_args, "--dspark", "--backbone", data], "--backbone: ")):
        p = run([*trainer, *args], expect=2)
        check(want in p.stderr and p.stderr.count("\n") == 1, f"a bad input is one clear error: {want!r}")


def init_checks(spec, trainer, tiny, data, tmp):
    """--init-from-target: the drafter's layer starts as the target's layer 1; q and k rows are in the
    rotate-half order, so every query-key product under the drafter's RoPE equals the target's under
    llama.cpp's interleaved RoPE (a wrong row order changes them); it trains, loads and drafts losslessly;
    bad combinations are one clear error."""
    import numpy as np
    from gguf import GGUFReader, quants
    from safetensors.numpy import load_file
    out, work = os.path.join(tmp, "init"), os.path.join(tmp, "init-work")
    common = ["--data", data, "--out", out, "--work", work, "--block-size", "4", "--draft-vocab", "256",
              "--layers", "1", "--log-every", "1", "--quiet", "--eval-share", "0.2"]
    run([*trainer, *common, "--init-from-target", tiny, "--init-layers", "1", "--max-steps", "1", "--epochs", "50",
         "--lr", "1e-9"])
    cfg = json.load(open(os.path.join(out, "config.json")))
    check(cfg["specactor"].get("initialised_from_target_layers") == [1], "the export records the seeding layer")
    w = load_file(os.path.join(out, "model.safetensors"))
    t = {x.name: x for x in GGUFReader(tiny).tensors}
    deq = lambda n: np.asarray(quants.dequantize(t[n].data, t[n].tensor_type), np.float64)  # noqa: E731
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    H = cfg["hidden_size"]
    down = deq("blk.1.ffn_down.weight").reshape(H, -1)
    check(np.allclose(w["layers.0.mlp.down_proj.weight"].astype(np.float64), down, atol=2e-3),
          "the drafter's MLP is the target layer's (within float16 rounding)")
    inv = cfg["rope_theta"] ** (-2.0 * np.arange(hd // 2) / hd)

    def rope_pairs(x, pos):  # llama.cpp: adjacent pairs
        x = x.reshape(-1, hd // 2, 2)
        c, s = np.cos(pos * inv), np.sin(pos * inv)
        return np.stack([x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c], -1).reshape(-1, hd)

    def rope_half(x, pos):  # the drafter: rotate-half
        x = x.reshape(-1, hd)
        c, s = np.cos(pos * inv), np.sin(pos * inv)
        return np.concatenate([x[:, :hd // 2] * c - x[:, hd // 2:] * s, x[:, hd // 2:] * c + x[:, :hd // 2] * s], -1)

    rng = np.random.default_rng(1)
    xq, xk = rng.normal(size=H), rng.normal(size=H)
    ref = rope_pairs(deq("blk.1.attn_q.weight").reshape(nh * hd, H) @ xq, 9)[0] @ \
        rope_pairs(deq("blk.1.attn_k.weight").reshape(nkv * hd, H) @ xk, 4)[0]
    mine = rope_half(w["layers.0.self_attn.q_proj.weight"].astype(np.float64) @ xq, 9)[0] @ \
        rope_half(w["layers.0.self_attn.k_proj.weight"].astype(np.float64) @ xk, 4)[0]
    check(abs(ref - mine) <= 1e-2 * max(1.0, abs(ref)),
          f"query-key products under the drafter's RoPE equal the target's ({mine:.4f} vs {ref:.4f})")
    run([*trainer, *common, "--init-from-target", tiny, "--init-layers", "1", "--max-steps", "6", "--epochs", "50",
         "--lr", "3e-3", "--resume"])
    plain = generate(spec, tiny, "Name three colors.", ["--speculative-algorithm", "NONE"])
    fast = generate(spec, tiny, "Name three colors.", ["--speculative-algorithm", "DFLASH",
                                                        "--speculative-draft-model-path", out,
                                                        "--speculative-adaptive", "false"])
    check(fast["tokens"] == plain["tokens"] and fast["speculative"]["drafted"] > 0,
          "a drafter seeded from the target trains, loads and drafts losslessly")
    # Without --init-layers: the layers after the last capture layer, or the target's last ones where it
    # ends first (the tiny target has 2 layers).
    deep = os.path.join(tmp, "init-deep")
    run([*trainer, "--data", data, "--out", deep, "--work", deep + ".work", "--block-size", "4", "--draft-vocab",
         "256", "--layers", "2", "--quiet", "--eval-share", "0.2", "--init-from-target", tiny, "--max-steps", "1",
         "--epochs", "50"])
    seeded = json.load(open(os.path.join(deep, "config.json")))["specactor"].get("initialised_from_target_layers")
    check(seeded == [0, 1], f"2 drafter layers on a 2-layer target start from its layers 0 and 1 (got {seeded})")
    bad = os.path.join(tmp, "bad-init")
    base = ["--data", data, "--out", bad, "--work", bad + ".work"]
    for args, want in (([*base, "--init-from-target", tiny, "--init-layers", "5"], "--init-layers: 5 is not a layer"),
                       ([*base, "--init-from-target", tiny, "--init-layers", "0,1"], "--init-layers: 2 id(s) for 1"),
                       ([*base, "--init-from-target", tiny, "--init-layers", "x"], "--init-layers: expected"),
                       ([*base, "--init-layers", "1"], "--init-layers: only applies with --init-from-target"),
                       ([*base, "--init-from-target", os.path.join(tmp, "nope.gguf")], "no such file"),
                       ([*base, "--init-from-target", data + "/manifest.json", "--init-layers", "1"],
                        "cannot read it as GGUF"),
                       ([*base, "--dspark", "--init-from-target", tiny], "--init-from-target: DFlash only"),
                       ([*base, "--init-from-target", tiny, "--layers", "3"], "are more than the target's 2")):
        p = run([*trainer, *args], expect=2)
        check(want in p.stderr and p.stderr.count("\n") == 1, f"a bad input is one clear error: {want!r}")


def main():
    build, model = sys.argv[1], sys.argv[2]
    spec = os.path.join(build, "specactor")
    trainer = [sys.executable, os.path.join(ROOT, "training", "train_dflash.py")]
    tmp = tempfile.mkdtemp(prefix="specactor-dflash-")
    try:
        tiny = os.path.join(tmp, "tiny.gguf")
        run([spec, "shrink", model, "--layers", "2", "--out", tiny])
        prompts = os.path.join(tmp, "prompts.jsonl")
        run([sys.executable, os.path.join(ROOT, "training", "make_prompts.py"), "--out", prompts, "--count", "16"])
        data = os.path.join(tmp, "data")
        run([spec, "make-data", "--prompts", prompts, "--out", data, "--max-new-tokens", "32", "--shard-samples", "8",
             "--model-path", tiny, "--threads", "2"])
        manifest = json.load(open(os.path.join(data, "manifest.json")))
        out, work = os.path.join(tmp, "drafter"), os.path.join(tmp, "work")
        common = ["--data", data, "--out", out, "--work", work, "--block-size", "4", "--draft-vocab", "256",
                  "--lr", "3e-3", "--log-every", "2", "--quiet", "--eval-share", "0.2"]
        run([*trainer, *common, "--max-steps", "16", "--epochs", "50"])
        hist = json.load(open(os.path.join(work, "history.json")))
        losses = [h["loss"] for h in hist if "loss" in h]
        check(len(losses) >= 6 and sum(losses[-2:]) < sum(losses[:2]),
              f"the training loss falls ({losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} log entries)")
        cfg = json.load(open(os.path.join(out, "config.json")))
        d = cfg["dflash_config"]
        check(cfg["architectures"] == ["DFlashDraftModel"] and d["block_size"] == 4 and d["mask_token_id"] == 16
              and d["target_layer_ids"] == manifest["target"]["aux_layers"],
              f"the export is a DFlashDraftModel (block 4, mask 16, target layers {d['target_layer_ids']} = the "
              f"data's capture layers)")
        info = json.loads(run([spec, "inspect", out, "--target", tiny]).stdout)
        check(info["kind"] == "DFLASH" and info["draft_vocab_size"] == 256 and info["fits_target"] == tiny,
              "specactor inspect --target loads it: DFLASH, a draft vocabulary of 256")
        drafted = 0
        for prompt in ("Name three colors.", "Write a haiku about rain.", "What is 12 times 7?"):
            plain = generate(spec, tiny, prompt, ["--speculative-algorithm", "NONE"])
            fast = generate(spec, tiny, prompt, ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                                                 out, "--speculative-adaptive", "false"])
            check(fast["tokens"] == plain["tokens"], f"DFLASH output equals plain greedy output for {prompt!r} "
                                                     f"(τ {fast['speculative']['mean_accepted_length']:.2f})")
            drafted += fast["speculative"]["drafted"]
        check(drafted > 0, f"the trained drafter drafted ({drafted} drafts)")
        again = run([*trainer, *common, "--max-steps", "20", "--epochs", "50", "--resume"])
        hist = json.load(open(os.path.join(work, "history.json")))
        check("resumed from" in again.stdout and max(h["step"] for h in hist) == 20,
              "--resume continues from the checkpoint (step 16 -> 20)")
        other = run([*trainer, *common, "--max-steps", "24", "--epochs", "50", "--resume", "--pos-decay", "0.9"],
                    expect=2)
        check("trained with --pos-decay" in other.stderr and other.stderr.count("\n") == 1,
              f"--resume under another objective (--pos-decay) is one clear error: {other.stderr.strip()!r}")
        for args, want in (([*common[:2], "--data", os.path.join(tmp, "nope"), "--out", out], "manifest.json: not found"),
                           ([*common, "--block-size", "1"], "--block-size: out of range"),
                           ([*common, "--mask-token-id", "999999"], "--mask-token-id: 999999 is outside")):
            p = run([*trainer, *args], expect=2)
            check(want in p.stderr and p.stderr.count("\n") == 1, f"a bad input is one clear error: {want!r}")
        dspark_checks(spec, trainer, tiny, data, out, tmp)
        init_checks(spec, trainer, tiny, data, tmp)
        print("all checks passed")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
