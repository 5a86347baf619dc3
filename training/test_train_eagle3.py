#!/usr/bin/env python3
"""The EAGLE-3 training pipeline end to end on a tiny target (CTest: train_eagle3_tiny).

A 2-block cut of the default model (`specactor shrink`) stands in for the target:
  make-data (3 shards; a second run resumes and changes nothing) -> train_eagle3.py for 40 steps
  (the logged loss must fall) -> the export loads in specactor (`inspect --target`) and drafts
  losslessly (`generate` with EAGLE3 equals plain greedy) -> `--resume` on changed data keeps the
  checkpoint's draft vocabulary; two data folders train as one and --init-from fine-tunes from another
  run's weights (keeping its draft vocabulary, or with --new-vocab choosing one on the data and carrying
  the shared tokens' output rows over); --intermediate-size widens the head's MLP (exported, loaded,
  lossless); --init-from an exported head folder grows its MLP with silent new units; --hard-weight and
  --ttt-decay change the objective as documented; the held-out chain count equals a plain walk over the pairs; the
  held-out split depends on each sample alone (data extended or reordered keeps every side);
and the bad inputs each give one clear error: a missing data folder, a corrupt shard, data made
from another target, a make-data folder reused with another model.

    .venv-train/bin/python training/test_train_eagle3.py BUILD_DIR MODEL.gguf
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, expect=0, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != expect:
        sys.exit(f"FAILED: {' '.join(cmd)}\nexit {p.returncode}, expected {expect}\nstdout:\n{p.stdout[-3000:]}\n"
                 f"stderr:\n{p.stderr[-3000:]}")
    return p


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}", flush=True)


def check_split():
    """The held-out split depends on each sample alone: extending or reordering the data keeps every
    old sample on its side, and the share is about the one asked for."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "training"))
    from train_eagle3 import held_out_split

    class Fake:
        def __init__(self, samples):
            self.tokens = np.concatenate(samples).astype(np.int32)
            self.offsets = np.cumsum([0] + [len(x) for x in samples])

        def __len__(self):
            return len(self.offsets) - 1

        def sample(self, i):
            return self.offsets[i], self.offsets[i + 1]

    rng = np.random.default_rng(3)
    samples = [rng.integers(0, 1000, rng.integers(5, 40)) for _ in range(3000)]
    key = lambda x: tuple(x.tolist())
    ev, tr = held_out_split(Fake(samples[:1800]), 0.05)
    check(sorted(ev + tr) == list(range(1800)) and 0.03 < len(ev) / 1800 < 0.07,
          f"held-out split covers every sample once, {len(ev)} of 1800 held out")
    held = {key(samples[i]) for i in ev}
    ev2, _ = held_out_split(Fake(samples), 0.05)
    check({key(samples[i]) for i in ev2 if i < 1800} == held, "extended data keeps the old samples' held-out side")
    order = rng.permutation(3000)
    ev3, _ = held_out_split(Fake([samples[i] for i in order]), 0.05)
    check({key(samples[order[i]]) for i in ev3} == {key(samples[i]) for i in ev2},
          "reordered data keeps every sample's side")
    ev4, _ = held_out_split(Fake(samples[:1800]), 0.05, seed=1)
    check({key(samples[i]) for i in ev4} != held, "another --seed draws another split")
    check(held_out_split(Fake(samples[:2]), 0.9)[1] != [] and held_out_split(Fake(samples[:2]), 0.01)[0] != [],
          "two samples: one on each side whatever the share")


def check_chain_metric():
    """train_eagle3.chain_accepted (vectorised) against a plain walk over every pair, on random data."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "training"))
    from train_eagle3 import chain_accepted

    rng = np.random.default_rng(7)
    B, T, K = 3, 29, 3
    ids = np.array([0, 2, 3])  # draft id -> target id; target id 1 is outside the draft vocabulary
    am = rng.integers(0, 4, (B, T))
    tok = np.where(rng.random((B, T)) < 0.8, np.roll(am, 1, axis=1), rng.integers(0, 4, (B, T)))  # mostly greedy
    lm = (rng.random((B, T)) < 0.8).astype(np.float32)
    valid = np.ones((B, T), np.float32)
    valid[1, 20:] = 0
    t2d_of = {t: d for d, t in enumerate(ids)}
    preds = [np.where(rng.random((B, T - 1)) < 0.7,  # mostly the target's choice where it can be drafted
                      np.vectorize(lambda t: t2d_of.get(int(t), 1))(np.roll(am, -(1 + k), axis=1)[:, :T - 1]),
                      rng.integers(0, 3, (B, T - 1))) for k in range(K)]
    want_sum = want_n = 0
    for b in range(B):
        for p in range(T - 2):
            if not (lm[b, p + 2] and valid[b, p + 2]):
                continue
            want_n += 1
            for k in range(K):
                pos = p + 1 + k
                if pos + 1 >= T or not (ids[preds[k][b, p]] == am[b, pos] and tok[b, pos + 1] == am[b, pos]
                                        and valid[b, pos + 1]):
                    break
                want_sum += 1
    got_sum, got_n = chain_accepted(tok, lm, am, valid, preds, ids)
    check(want_n > 20 and want_sum > want_n // 2 and (got_sum, got_n) == (want_sum, want_n),
          f"the held-out greedy-chain count equals a plain walk over the pairs ({got_sum:.0f} accepted over "
          f"{got_n:.0f} pairs)")


def main():
    build, model = sys.argv[1], sys.argv[2]
    check_split()
    check_chain_metric()
    spec = os.path.join(build, "specactor")
    tmp = tempfile.mkdtemp(prefix="specactor-train-")
    try:
        tiny = os.path.join(tmp, "tiny.gguf")
        run([spec, "shrink", model, "--layers", "2", "--out", tiny])
        other = os.path.join(tmp, "other.gguf")
        run([spec, "shrink", model, "--layers", "3", "--out", other])
        prompts = os.path.join(tmp, "prompts.jsonl")
        run([sys.executable, os.path.join(ROOT, "training", "make_prompts.py"), "--out", prompts, "--count", "12"])
        data = os.path.join(tmp, "data")
        common = ["--prompts", prompts, "--out", data, "--max-new-tokens", "24", "--shard-samples", "5",
                  "--model-path", tiny, "--threads", "2"]
        run([spec, "make-data", *common])
        manifest = json.load(open(os.path.join(data, "manifest.json")))
        check(manifest["complete"] and len(manifest["shards"]) == 3, "make-data wrote 12 samples in 3 shards")
        stamp = {f: os.path.getmtime(os.path.join(data, f)) for f in os.listdir(data) if f.startswith("shard-")}
        again = run([spec, "make-data", *common])
        check(all(os.path.getmtime(os.path.join(data, f)) == t for f, t in stamp.items()) and
              "12 samples" in again.stdout, "a second make-data run resumes: nothing regenerated")
        p = run([spec, "make-data", *common[:-4], "--model-path", other], expect=2)
        check("another target" in p.stderr, "make-data refuses a folder made from another model: " +
              p.stderr.strip().splitlines()[-1])

        bad_prompts = os.path.join(tmp, "bad.jsonl")
        with open(bad_prompts, "w") as f:
            f.write('{"prompt": "fine"}\n{"prompt": 3}\n')
        p = run([spec, "make-data", "--prompts", bad_prompts, "--out", os.path.join(tmp, "d2"), "--model-path", tiny],
                expect=2)
        check("bad.jsonl:2: expected a string" in p.stderr, "a malformed prompt line: " + p.stderr.strip())
        p = run([spec, "make-data", "--prompts", prompts, "--out", os.path.join(tmp, "d3"), "--model-path", tiny,
                 "--sampled-share", "1.5"], expect=2)
        check("--sampled-share" in p.stderr, "an out-of-range flag: " + p.stderr.strip())

        head = os.path.join(tmp, "head")
        work = os.path.join(tmp, "work")
        train = [sys.executable, os.path.join(ROOT, "training", "train_eagle3.py"), "--data", data, "--out", head,
                 "--work", work, "--draft-vocab", "512", "--batch-tokens", "256", "--max-steps", "40",
                 "--epochs", "100", "--log-every", "5", "--lr", "2e-3", "--eval-share", "0", "--quiet"]
        run(train)
        hist = [h for h in json.load(open(os.path.join(work, "history.json"))) if "loss" in h]
        first, last = hist[0]["loss"], min(h["loss"] for h in hist[-2:])
        check(len(hist) >= 4 and last < 0.8 * first, f"the training loss falls ({first:.3f} -> {last:.3f})")
        cfg = json.load(open(os.path.join(head, "config.json")))
        check(cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 512,
              "config.json in the EAGLE-3 layout")
        p = run([spec, "inspect", head, "--target", tiny])
        check('"own_output_vocab": 512' in p.stdout and '"kind": "EAGLE3"' in p.stdout,
              "specactor loads the exported head against the target")
        gen = [spec, "generate", "--model-path", tiny, "--chat", "--prompt", "Tell me about honey bees.",
               "--max-new-tokens", "24", "--json", "--threads", "2"]
        plain = json.loads(run(gen).stdout)
        drafted = json.loads(run(gen + ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                        head]).stdout)
        check(plain["tokens"] == drafted["tokens"] and drafted["speculative"]["drafted"] > 0,
              f"EAGLE3 with the trained head equals plain greedy (τ {drafted['speculative']['mean_accepted_length']:.2f})")

        # --resume keeps the checkpoint's draft vocabulary when the data changed (here: fewer samples,
        # whose own frequency vocabulary differs), so grown data can be trained on.
        import numpy as np
        from safetensors.numpy import load_file
        sys.path.insert(0, os.path.join(ROOT, "training"))
        from train_eagle3 import Dataset, select_vocab
        work2, head2 = os.path.join(tmp, "work2"), os.path.join(tmp, "head2")
        shutil.copytree(work, work2)
        resumed = train[:]
        for flag, value in (("--work", work2), ("--out", head2), ("--max-steps", "44")):
            resumed[resumed.index(flag) + 1] = value
        p = run(resumed + ["--max-samples", "6", "--resume"])
        own = select_vocab(Dataset(data, 6), 512)[0]
        d2t_a, d2t_b = load_file(os.path.join(head, "model.safetensors"))["d2t"], \
            load_file(os.path.join(head2, "model.safetensors"))["d2t"]
        check("resumed from" in p.stdout and np.array_equal(d2t_a, d2t_b) and
              not np.array_equal(own, np.arange(512) + d2t_a),
              "--resume on changed data keeps the checkpoint's draft vocabulary")
        bad_vocab = resumed[:]
        bad_vocab[bad_vocab.index("--draft-vocab") + 1] = "256"
        p = run(bad_vocab + ["--resume"], expect=2)
        check("does not fit --draft-vocab 256" in p.stderr, "a checkpoint whose vocabulary does not fit: " +
              p.stderr.strip())

        # Several data folders train as one; --init-from starts from another run's weights and draft
        # vocabulary with a fresh optimizer (fine-tuning on new data).
        check(len(Dataset([data, data])) == 2 * len(Dataset(data)), "two data folders load as one data set")
        work3, head3 = os.path.join(tmp, "work3"), os.path.join(tmp, "head3")
        tuned = train[:]
        for flag, value in (("--work", work3), ("--out", head3), ("--max-steps", "4"), ("--lr", "1e-5")):
            tuned[tuned.index(flag) + 1] = value
        tuned[tuned.index("--data") + 1:tuned.index("--data") + 2] = [data, data]
        p = run(tuned + ["--init-from", os.path.join(work, "checkpoint.npz")])
        hist3 = [h for h in json.load(open(os.path.join(work3, "history.json"))) if "loss" in h]
        check("weights from" in p.stdout and hist3[-1]["step"] == 4 and
              np.array_equal(load_file(os.path.join(head3, "model.safetensors"))["d2t"], d2t_a) and
              hist3[0]["loss"] < 0.9 * first,
              f"--init-from on two folders: 4 fresh steps from the trained weights (loss {hist3[0]['loss']:.3f}, "
              f"a fresh head's {first:.3f}), the same draft vocabulary")
        p = run(tuned + ["--init-from", os.path.join(tmp, "nothing.npz")], expect=2)
        check("--init-from" in p.stderr and "not found" in p.stderr, "a missing --init-from: " + p.stderr.strip())
        # --new-vocab: a vocabulary chosen on the data (here a larger one); the output rows of tokens
        # in both vocabularies carry over, the others start from the target's output head.
        work4, head4 = os.path.join(tmp, "work4"), os.path.join(tmp, "head4")
        revocab = tuned[:]
        for flag, value in (("--work", work4), ("--out", head4), ("--draft-vocab", "768")):
            revocab[revocab.index(flag) + 1] = value
        p = run(revocab + ["--init-from", os.path.join(work, "checkpoint.npz"), "--new-vocab"])
        w_old, w_new = load_file(os.path.join(head, "model.safetensors")), load_file(os.path.join(head4, "model.safetensors"))
        target_head = load_file(os.path.join(data, "target.safetensors"))["lm_head"].astype(np.float32)
        ids_old, ids_new = np.arange(512) + w_old["d2t"], np.arange(768) + w_new["d2t"]
        where_old = {int(t): j for j, t in enumerate(ids_old)}
        shared = [(i, where_old[int(t)]) for i, t in enumerate(ids_new) if int(t) in where_old]
        fresh = [i for i, t in enumerate(ids_new) if int(t) not in where_old]
        near = lambda x, y: np.allclose(x.astype(np.float32), y.astype(np.float32), atol=2e-3)
        rows_kept = all(near(w_new["lm_head.weight"][i], w_old["lm_head.weight"][j]) for i, j in shared)
        rows_fresh = all(near(w_new["lm_head.weight"][i], target_head[ids_new[i]]) for i in fresh)
        check(f"{len(shared)} of its 768 tokens carry" in p.stdout and len(shared) == 512 and len(fresh) == 256 and
              rows_kept and rows_fresh and w_new["t2d"].sum() == 768,
              f"--init-from --new-vocab: a 768-token vocabulary, {len(shared)} output rows carried over, "
              f"{len(fresh)} from the target's output head")
        p = run(train + ["--new-vocab"], expect=2)
        check("--new-vocab: needs --init-from" in p.stderr, "--new-vocab alone: " + p.stderr.strip())
        # --intermediate-size: a head whose MLP is wider than the target's; it exports, loads and drafts.
        work5, head5 = os.path.join(tmp, "work5"), os.path.join(tmp, "head5")
        wide = train[:]
        for flag, value in (("--work", work5), ("--out", head5), ("--max-steps", "4")):
            wide[wide.index(flag) + 1] = value
        run(wide + ["--intermediate-size", "2048"])
        w5 = load_file(os.path.join(head5, "model.safetensors"))
        p = run([spec, "inspect", head5, "--target", tiny])
        drafted5 = json.loads(run(gen + ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                         head5]).stdout)
        check(json.load(open(os.path.join(head5, "config.json")))["intermediate_size"] == 2048 and
              w5["midlayer.mlp.up_proj.weight"].shape == (2048, 576) and p.returncode == 0 and
              drafted5["tokens"] == plain["tokens"],
              "--intermediate-size 2048: exported, loaded by specactor, lossless")
        p = run(wide + ["--intermediate-size", "-1"], expect=2)
        check("--intermediate-size: out of range" in p.stderr, "a negative --intermediate-size: " + p.stderr.strip())
        # --init-from an exported head folder (as the shipped head is) with a wider MLP: the same function
        # to start with (the new units' down rows are zero), so the loss starts where the checkpoint's does.
        work6, head6 = os.path.join(tmp, "work6"), os.path.join(tmp, "head6")
        grown = tuned[:]
        for flag, value in (("--work", work6), ("--out", head6)):
            grown[grown.index(flag) + 1] = value
        p = run(grown + ["--init-from", head, "--intermediate-size", "2048"])
        hist6 = [h for h in json.load(open(os.path.join(work6, "history.json"))) if "loss" in h]
        w6 = load_file(os.path.join(head6, "model.safetensors"))
        down6 = w6["midlayer.mlp.down_proj.weight"].astype(np.float32)  # [H, F]
        check("MLP grown from 1536 to 2048" in p.stdout and np.array_equal(w6["d2t"], d2t_a) and
              down6.shape == (576, 2048) and np.abs(down6[:, 1536:]).max() < 5e-3 and
              abs(hist6[0]["loss"] - hist3[0]["loss"]) < 0.02 * hist3[0]["loss"],
              f"--init-from a head folder, MLP 1536 -> 2048: loss {hist6[0]['loss']:.3f} against "
              f"{hist3[0]['loss']:.3f} from the checkpoint, the new units start silent, the same vocabulary")
        # The objective's weights: --hard-weight adds a positive term (the cross-entropy against the
        # target's argmax), --ttt-decay 0.5 weighs the later TTT steps less; same start, same batches.
        losses = {}
        for name, extra in (("hard", ["--hard-weight", "1"]), ("decay", ["--ttt-decay", "0.5"])):
            variant = tuned[:]
            for flag, value in (("--work", os.path.join(tmp, "work7" + name)), ("--out", os.path.join(tmp, "h7" + name))):
                variant[variant.index(flag) + 1] = value
            run(variant + ["--init-from", os.path.join(work, "checkpoint.npz")] + extra)
            losses[name] = [h for h in json.load(open(os.path.join(tmp, "work7" + name, "history.json")))
                            if "loss" in h][0]["loss"]
        check(losses["hard"] > 1.05 * hist3[0]["loss"] and losses["decay"] < 0.98 * hist3[0]["loss"],
              f"--hard-weight 1 raises the first loss ({hist3[0]['loss']:.3f} -> {losses['hard']:.3f}), "
              f"--ttt-decay 0.5 lowers it (-> {losses['decay']:.3f})")
        p = run(tuned + ["--ttt-decay", "0"], expect=2)
        check("--ttt-decay: out of range" in p.stderr, "--ttt-decay 0: " + p.stderr.strip())
        p = run(grown + ["--init-from", head6, "--intermediate-size", "1024"], expect=2)
        check("wider than --intermediate-size 1024" in p.stderr, "--init-from a wider head: " + p.stderr.strip())
        os.remove(os.path.join(head6, "config.json"))
        p = run(grown + ["--init-from", head6], expect=2)
        check("expected config.json and model.safetensors" in p.stderr, "--init-from a folder without a config: " +
              p.stderr.strip())

        # Bad input: one clear error each.
        p = run(train[:2] + ["--data", os.path.join(tmp, "missing"), "--out", head], expect=2)
        check("manifest.json: not found" in p.stderr, "a missing data folder: " + p.stderr.strip())
        bad = os.path.join(tmp, "bad")
        shutil.copytree(data, bad)
        shard = os.path.join(bad, "shard-00001.safetensors")
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) // 2)
        p = run(train[:2] + ["--data", bad, "--out", head], expect=2)
        check("shard-00001.safetensors: cannot read" in p.stderr, "a corrupt shard: " + p.stderr.strip())
        mixed = os.path.join(tmp, "mixed")
        shutil.copytree(data, mixed)
        m = json.load(open(os.path.join(mixed, "manifest.json")))
        m["target"]["fingerprint"] = "0000000000000000"
        json.dump(m, open(os.path.join(mixed, "manifest.json"), "w"))
        p = run(train[:2] + ["--data", mixed, "--out", head], expect=2)
        check("made from another target" in p.stderr, "shards from another target: " + p.stderr.strip())
        p = run(train[:2] + ["--data", data, mixed, "--out", head], expect=2)
        check("made from another target or capture layers" in p.stderr,
              "two data folders of different targets: " + p.stderr.strip())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("train_eagle3_tiny: all checks passed")


if __name__ == "__main__":
    main()
