#!/usr/bin/env python3
"""Trains a DFlash block drafter on data written by `specactor make-data` (the same data the EAGLE-3
head trains on), and exports it as a DFlashDraftModel folder (config.json + model.safetensors) that
specactor loads with --speculative-algorithm DFLASH; with --dspark, a DSpark drafter (DSparkDraftModel,
--speculative-algorithm DSPARK).

    .venv-train/bin/python training/train_dflash.py --data data/dflash/data --out DIR \
        [--block-size 8] [--layers 1] [--epochs 2] [--draft-vocab 4096] [--lr 1e-3] [--resume]
    .venv-train/bin/python training/train_dflash.py --data data/dflash/data --out DIR --dspark \
        --backbone TRAINED_DFLASH_DIR [--freeze-backbone] [--markov-rank 64]

The model (model/block_drafter.hpp, row for row): context rows c_p = hidden_norm(fc(h_p)) of the
target's captured layers (make-data's capture layers become the drafter's target_layer_ids); a block
[t_a, MASK x (B-1)] at positions a .. a+B-1 whose rows attend to every context row p < a and to each
other (non-causal inside the block), through Qwen3 decoder layers (q/k RMSNorm per head, rotate-half
RoPE); block row k >= 1 scores the draft for position a+k over the draft vocabulary's rows of the
target's output head (frozen, as is the target's embedding).
Objective: blocks at random anchors a (a response token follows a); row k is scored by the soft
cross-entropy against the target's next-token distribution at position a+k-1 (restricted to the draft
vocabulary), weighted DECAY^(k-1) (--pos-decay); rows whose token is not a response token, or whose
target argmax lies outside the draft vocabulary, are masked.
DSpark (model/block_drafter.hpp): the same backbone, then per row j (drafting position a+j+1) the
Markov term W2 W1[t_{a+j}] (the token before it: teacher-forced, which is what the engine drafts from
whenever drafts 1..j were accepted) is added to the logits, and a confidence c_j = sigmoid(w.[h_j ;
W1[t_{a+j}]] + b) is trained by binary cross-entropy to predict whether row j's argmax is the target's.
With --no-markov-first-row the first row (j = 0, whose token before is the block's own first input t_a)
gets no Markov term: the first draft is the backbone's, and the config says markov_first_row: false.
Its loss: CE_WEIGHT x the soft cross-entropy above + TVD_WEIGHT x the total variation between the draft
and target distributions (same position weights) + CONF_WEIGHT x the confidence's cross-entropy. With
--backbone the backbone (and draft vocabulary) start from a trained DFlash drafter, the Markov term at
zero (so training starts from that drafter's drafts exactly); --freeze-backbone trains the heads only.
--resume continues from --work's checkpoint, and refuses one made under another block size, layer
count, mask token, position decay or DSpark setting (--epochs and --lr may change).
Everything is float32 on the CPU (JAX, pinned in training/requirements-train.txt).
"""
import argparse
import json
import math
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_eagle3 import (DataError, Dataset, batches, held_out_split, make_batch, select_vocab,  # noqa: E402
                          write_chart)

# SmolLM2's tokenizer reserves <empty_output> (id 16) for code pretraining; chat never produces it.
DEFAULT_MASK = 16


def fail(msg):
    print(f"train_dflash: error: {msg}", file=sys.stderr)
    sys.exit(2)


def anchors(lm, valid, count, rng):
    """[S, count] block anchors (-1: none): positions a >= 1 whose next token is a response token,
    drawn without replacement."""
    S, T = lm.shape
    out = np.full((S, count), -1, np.int32)
    for s in range(S):
        ok = np.flatnonzero((lm[s, 2:] > 0) & (valid[s, 2:] > 0)) + 1  # a in [1, T-2]
        if len(ok):
            pick = rng.choice(ok, size=min(count, len(ok)), replace=False)
            out[s, :len(pick)] = np.sort(pick)
    return out


def init_params(key, cfg, norm_init):
    import jax
    import jax.numpy as jnp

    H, F, QD, KD, hd = cfg["H"], cfg["F"], cfg["QD"], cfg["KD"], cfg["hd"]
    ks = iter(jax.random.split(key, 1 + 7 * cfg["layers"]))

    def lin(i, o, scale=1.0):
        return jax.random.normal(next(ks), (i, o), jnp.float32) * (scale / math.sqrt(i))

    # The final norm starts as the target's: its output head expects the target's scale.
    p = {"fc": lin(cfg["K"] * H, H), "hidden_norm": jnp.ones(H), "norm": jnp.asarray(norm_init), "layers": []}
    for _ in range(cfg["layers"]):
        p["layers"].append({"input_layernorm": jnp.ones(H), "post_attention_layernorm": jnp.ones(H),
                            "q": lin(H, QD), "k": lin(H, KD), "v": lin(H, KD), "o": lin(QD, H, 0.1),
                            "q_norm": jnp.ones(hd), "k_norm": jnp.ones(hd),
                            "gate": lin(H, F), "up": lin(H, F), "down": lin(F, H, 0.1)})
    return p


def init_heads(key, cfg):
    """DSpark's Markov and confidence heads: W2 = 0 and w = 0, so the drafts start as the backbone's and
    every confidence at 1/2."""
    import jax
    import jax.numpy as jnp

    r = cfg["rank"]
    return {"w1": jax.random.normal(key, (cfg["V"], r), jnp.float32) * 0.02,
            "w2": jnp.zeros((r, cfg["Vd"]), jnp.float32),
            "cw": jnp.zeros((cfg["H"] + r,), jnp.float32), "cb": jnp.zeros((), jnp.float32)}


def load_backbone(folder, cfg, fail_fn):
    """A trained DFlash drafter's backbone as training parameters, and its draft vocabulary."""
    from safetensors.numpy import load_file

    try:
        c = json.load(open(os.path.join(folder, "config.json")))
        t = load_file(os.path.join(folder, "model.safetensors"))
    except (OSError, ValueError) as e:
        fail_fn(f"--backbone: {folder}: cannot read config.json and model.safetensors ({e})")
    if "DFlashDraftModel" not in c.get("architectures", []):
        fail_fn(f"--backbone: {folder}/config.json: 'architectures' must name DFlashDraftModel")
    d = c.get("dflash_config", {})
    for field, have, want in [("target_layer_ids", d.get("target_layer_ids"), cfg["target_layer_ids"]),
                              ("hidden_size", c.get("hidden_size"), cfg["H"])]:
        if have != want:
            fail_fn(f"--backbone: {folder}/config.json: '{field}' is {have} but the data's is {want}")
    if "draft_vocab" not in t:
        fail_fn(f"--backbone: {folder}: model.safetensors has no draft_vocab (train_dflash.py writes one)")
    cfg.update(layers=c["num_hidden_layers"], block=d["block_size"], mask=d["mask_token_id"],
               F=c["intermediate_size"])
    f = {k: np.asarray(v, np.float32) for k, v in t.items() if k != "draft_vocab"}
    p = {"fc": f["fc.weight"].T, "hidden_norm": f["hidden_norm.weight"], "norm": f["norm.weight"], "layers": []}
    names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
    for i in range(cfg["layers"]):
        pre = f"layers.{i}."
        ly = {k: f[pre + hf + ".weight"].T for k, hf in names.items()}
        ly.update({k: f[pre + k + ".weight"] for k in ("input_layernorm", "post_attention_layernorm")})
        ly["q_norm"], ly["k_norm"] = f[pre + "self_attn.q_norm.weight"], f[pre + "self_attn.k_norm.weight"]
        p["layers"].append(ly)
    return p, t["draft_vocab"].astype(np.int32)


def target_init(path, layer_ids, cfg, ds, fail_fn):
    """Decoder layers copied from the target's GGUF (llama layout): q/k/v/o and the MLP dequantized,
    q and k rows put back in the rotate-half order the drafter's RoPE uses (llama.cpp's converter
    interleaves them), the layer norms as they are; fc starts as the selection of the last capture
    layer's slot and hidden_norm as the first copied layer's input norm, so the first draft layer's
    context keys and values are, up to the q/k norms, that target layer's own. The q/k norms (the
    target has none) start at the mean per-head RMS of the target's q and k on a data sample, which
    keeps the attention logits' scale."""
    try:
        from gguf import GGUFReader, quants
    except ImportError:
        fail_fn("--init-from-target: needs the gguf package (training/requirements-train.txt; rerun training/train-venv)")
    try:
        r = GGUFReader(path)
    except (OSError, ValueError) as e:
        fail_fn(f"--init-from-target: {path}: cannot read it as GGUF ({e})")
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode() if "general.architecture" in r.fields else "?"
    if arch != "llama":
        fail_fn(f"--init-from-target: {path}: architecture '{arch}'; only llama targets can seed the drafter")
    names = {t.name: t for t in r.tensors}
    H, nh, nkv, hd = cfg["H"], cfg["nh"], cfg["nkv"], cfg["hd"]

    def get(name, shape):
        t = names.get(name)
        if t is None:
            fail_fn(f"--init-from-target: {path}: no tensor {name} (layer past the target's depth?)")
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
        return w

    def unpermute(w, heads):  # [heads*hd, in] from the interleaved pair order to rotate-half
        return w.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)

    if cfg["F"] != int(get(f"blk.{layer_ids[0]}.ffn_up.weight", (-1, H)).shape[0]):
        fail_fn("--init-from-target: --intermediate-size must be the target's to copy its MLP")
    layers = []
    for L in layer_ids:
        ly = {"q": unpermute(get(f"blk.{L}.attn_q.weight", (nh * hd, H)), nh).T,
              "k": unpermute(get(f"blk.{L}.attn_k.weight", (nkv * hd, H)), nkv).T,
              "v": get(f"blk.{L}.attn_v.weight", (nkv * hd, H)).T,
              "o": get(f"blk.{L}.attn_output.weight", (H, nh * hd)).T,
              "gate": get(f"blk.{L}.ffn_gate.weight", (cfg["F"], H)).T,
              "up": get(f"blk.{L}.ffn_up.weight", (cfg["F"], H)).T,
              "down": get(f"blk.{L}.ffn_down.weight", (H, cfg["F"])).T,
              "input_layernorm": get(f"blk.{L}.attn_norm.weight", (H,)),
              "post_attention_layernorm": get(f"blk.{L}.ffn_norm.weight", (H,))}
        layers.append(ly)
    K = cfg["K"]
    fc = np.random.default_rng(0).normal(0, 0.02 / math.sqrt(K * H), (K * H, H)).astype(np.float32)
    fc[(K - 1) * H:, :] += np.eye(H, dtype=np.float32)
    hidden_norm = layers[0]["input_layernorm"].copy()
    n = min(len(ds.aux), 4096)
    c = ds.aux[np.linspace(0, len(ds.aux) - 1, n).astype(np.int64)].astype(np.float32) @ fc
    c = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + cfg["eps"]) * hidden_norm
    for ly in layers:
        q, k = (c @ ly["q"]).reshape(n, nh, hd), (c @ ly["k"]).reshape(n, nkv, hd)
        ly["q_norm"] = np.full(hd, float(np.mean(np.sqrt(np.mean(q * q, axis=-1)))), np.float32)
        ly["k_norm"] = np.full(hd, float(np.mean(np.sqrt(np.mean(k * k, axis=-1)))), np.float32)
    return {"fc": fc, "hidden_norm": hidden_norm, "norm": ds.output_norm.copy(), "layers": layers}


def build_fns(cfg, tx, pos_decay, mix=None):
    """The train step and the loss over the trainable parameters {"bb": backbone?, "heads": DSpark's?}
    (what is not trainable comes in `frozen`). mix: DSpark's (ce, tvd, conf) weights, None for DFlash."""
    import jax
    import jax.numpy as jnp
    import optax

    nh, nkv, hd, eps, B = cfg["nh"], cfg["nkv"], cfg["hd"], cfg["eps"], cfg["block"]
    group, half, scale = nh // nkv, hd // 2, 1.0 / math.sqrt(hd)
    inv = jnp.asarray(cfg["rope_theta"] ** (-2.0 * np.arange(half) / hd), jnp.float32)
    weights = jnp.asarray(pos_decay ** np.arange(B - 1), jnp.float32)
    # DSpark: the rows whose logits get the Markov term (row 0 only with markov_first_row)
    markov_rows = jnp.asarray([1.0 if j > 0 or cfg.get("markov_first_row", True) else 0.0 for j in range(B - 1)],
                              jnp.float32)

    def rms(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x, pos):  # x [..., n, heads, hd], pos [..., n]
        ang = pos[..., None].astype(jnp.float32) * inv
        c, s = jnp.cos(ang)[..., None, :], jnp.sin(ang)[..., None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return jnp.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)

    def forward(p, embed, head_d, batch):
        tok, lm, am, aux, last, valid, anc = batch[:7]
        S, T = tok.shape
        A = anc.shape[1]
        a = jnp.maximum(anc, 0)
        c = rms(aux @ p["fc"], p["hidden_norm"])  # [S, T, H]
        ctx_pos = jnp.arange(T)
        root = jnp.take_along_axis(tok, a, axis=1)  # [S, A]
        btok = jnp.concatenate([root[..., None], jnp.full((S, A, B - 1), cfg["mask"], tok.dtype)], axis=-1)
        x = embed[btok]  # [S, A, B, H]
        bpos = a[..., None] + jnp.arange(B)  # [S, A, B]
        seen = (ctx_pos[None, None, :] < a[..., None])[:, :, None, None, :]  # context p < a: [S, A, 1, 1, T]
        for ly in p["layers"]:
            y = rms(x, ly["input_layernorm"])
            q = rope(rms((y @ ly["q"]).reshape(S, A, B, nh, hd), ly["q_norm"]), bpos)
            kb = rope(rms((y @ ly["k"]).reshape(S, A, B, nkv, hd), ly["k_norm"]), bpos)
            vb = (y @ ly["v"]).reshape(S, A, B, nkv, hd)
            kc = rope(rms((c @ ly["k"]).reshape(S, T, nkv, hd), ly["k_norm"]), jnp.broadcast_to(ctx_pos, (S, T)))
            vc = (c @ ly["v"]).reshape(S, T, nkv, hd)
            kc, vc = jnp.repeat(kc, group, axis=2), jnp.repeat(vc, group, axis=2)
            kb, vb = jnp.repeat(kb, group, axis=3), jnp.repeat(vb, group, axis=3)
            sc = jnp.einsum("sabhd,sthd->sabht", q, kc) * scale
            sc = jnp.where(seen, sc, -1e30)
            sb = jnp.einsum("sabhd,sarhd->sabhr", q, kb) * scale  # the whole block: non-causal
            w = jax.nn.softmax(jnp.concatenate([sc, sb], axis=-1), axis=-1)
            att = jnp.einsum("sabht,sthd->sabhd", w[..., :T], vc) + jnp.einsum("sabhr,sarhd->sabhd", w[..., T:], vb)
            x = x + att.reshape(S, A, B, nh * hd) @ ly["o"]
            hm = rms(x, ly["post_attention_layernorm"])
            x = x + (jax.nn.silu(hm @ ly["gate"]) * (hm @ ly["up"])) @ ly["down"]
        hid = rms(x[:, :, 1:], p["norm"])
        return hid @ head_d, hid  # [S, A, B-1, Vd], [S, A, B-1, H]

    def loss_fn(trainable, frozen, embed, head_d, tgt_norm, batch):
        tok, lm, am, aux, last, valid, anc, in_vocab = batch
        S, T = tok.shape
        both = {**frozen, **trainable}
        logits, hid = forward(both["bb"], embed, head_d, batch)
        conf = None
        if mix is not None:  # DSpark: the Markov term of the token before each row, the confidences
            hp = both["heads"]
            prev = jnp.take_along_axis(tok, jnp.clip(jnp.maximum(anc, 0)[..., None] + jnp.arange(B - 1), 0, T - 1)
                                       .reshape(S, -1), axis=1).reshape(anc.shape + (B - 1,))
            e = hp["w1"][prev]  # [S, A, B-1, r]
            logits = logits + (e @ hp["w2"]) * markov_rows[:, None]
            conf_logit = jnp.concatenate([hid, e], axis=-1) @ hp["cw"] + hp["cb"]
        logp = jax.nn.log_softmax(logits, axis=-1)
        # row k scores position a+k: the target's distribution after position a+k-1
        lpos = jnp.clip(jnp.maximum(anc, 0)[..., None] + jnp.arange(B - 1), 0, T - 2)  # [S, A, B-1]
        tprob = jax.lax.stop_gradient(jax.nn.softmax(rms(last, tgt_norm) @ head_d, axis=-1))  # [S, T, Vd]
        tp = jax.vmap(lambda t, i: t[i])(tprob, lpos)  # [S, A, B-1, Vd]
        take = jax.vmap(lambda v, i: v[i])
        inb = (jnp.maximum(anc, 0)[..., None] + jnp.arange(B - 1)) <= T - 2
        m = (anc[..., None] >= 0) & inb & (take(lm, lpos + 1) > 0) & (take(valid, lpos + 1) > 0)
        m = m.astype(jnp.float32) * in_vocab[take(am, lpos)]
        ce = -jnp.sum(tp * logp, axis=-1)
        n = jnp.maximum(jnp.sum(m), 1.0)
        loss = jnp.sum(ce * m * weights) / n
        pred = jnp.argmax(logits, axis=-1)
        if mix is not None:
            tvd = 0.5 * jnp.sum(jnp.abs(jnp.exp(logp) - tp), axis=-1)
            hit = jax.lax.stop_gradient((pred == jnp.argmax(tp, axis=-1)).astype(jnp.float32))
            bce = optax.sigmoid_binary_cross_entropy(conf_logit, hit)
            loss = mix[0] * loss + mix[1] * jnp.sum(tvd * m * weights) / n + mix[2] * jnp.sum(bce * m) / n
            conf = jax.nn.sigmoid(conf_logit)
        return loss, (pred, m, ce, conf)

    def train_step(trainable, frozen, opt_state, embed, head_d, tgt_norm, batch):
        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, frozen, embed, head_d, tgt_norm,
                                                                     batch)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss

    return jax.jit(train_step), jax.jit(loss_fn)


def block_accepted(tok, am, anc, pred, mask, ids, B):
    """Greedy chain acceptance as the engine counts it, on teacher-forced data: at anchor a, draft k
    (block row k) is accepted when drafts 1..k-1 were, its target id equals the target's argmax at
    position a+k-1, and the data continues with that argmax. Returns (accepted per position, anchors
    counted, sum of accepted lengths, flags [S, A, B-1]: 1 where drafts 1..k were all accepted, 0 where
    not, -1 where the position was not counted)."""
    S, T = tok.shape
    acc = np.zeros(B - 1)
    flags = np.full(pred.shape[:2] + (B - 1,), -1, np.int8)
    total, counted = 0.0, 0
    for s in range(S):
        for j, a in enumerate(anc[s]):
            if a < 0 or mask[s, j, 0] == 0:
                continue
            counted += 1
            for k in range(1, B):
                p = a + k - 1
                if p + 1 >= T or mask[s, j, k - 1] == 0:
                    break
                if ids[pred[s, j, k - 1]] != am[s, p] or tok[s, p + 1] != am[s, p]:
                    flags[s, j, k - 1:] = 0
                    break
                flags[s, j, k - 1] = 1
                acc[k - 1] += 1
                total += 1
    return acc, counted, total, flags


def calibration(conf, flags):
    """DSpark's confidences against the chain: the survival prod(c_1..c_k) as the prediction that drafts
    1..k are all accepted; the expected calibration error over ten bins, and the mean prediction and
    rate per position."""
    surv = np.cumprod(conf, axis=-1)
    ok = flags >= 0
    pred, obs = surv[ok], flags[ok].astype(np.float64)
    if pred.size == 0:
        return None
    bins = np.clip((pred * 10).astype(int), 0, 9)
    ece = sum(abs(pred[bins == b].sum() - obs[bins == b].sum()) for b in range(10)) / pred.size
    per_pos = [[round(float(surv[..., k][ok[..., k]].mean()), 4), round(float(flags[..., k][ok[..., k]].mean()), 4)]
               for k in range(flags.shape[-1]) if ok[..., k].any()]
    return {"ece": round(float(ece), 4), "predicted_vs_accepted_by_position": per_pos}


def export(params, cfg, ids, out, info, heads=None):
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    t = {"fc.weight": params["fc"].T, "hidden_norm.weight": params["hidden_norm"], "norm.weight": params["norm"],
         "draft_vocab": np.asarray(ids, np.int32)}
    names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
    for i, ly in enumerate(params["layers"]):
        pre = f"layers.{i}."
        for k, hf in names.items():
            t[pre + hf + ".weight"] = ly[k].T
        for k in ("input_layernorm", "post_attention_layernorm"):
            t[pre + k + ".weight"] = ly[k]
        t[pre + "self_attn.q_norm.weight"] = ly["q_norm"]
        t[pre + "self_attn.k_norm.weight"] = ly["k_norm"]
    if heads is not None:  # DSpark's heads, in the layout model/block_drafter.hpp reads
        t["markov_head.w1.weight"] = heads["w1"]
        t["markov_head.w2.weight"] = heads["w2"].T
        t["confidence_head.weight"] = heads["cw"][None, :]
        t["confidence_head.bias"] = np.reshape(heads["cb"], (1,))
    # float16, as the published checkpoints store theirs (bfloat16 there; float16 keeps more mantissa)
    t = {k: np.ascontiguousarray(np.asarray(v, np.int32 if k == "draft_vocab" else np.float16)) for k, v in t.items()}
    for k, v in t.items():
        if k != "draft_vocab" and not np.all(np.isfinite(v)):
            raise SystemExit(f"train_dflash: error: {k} does not fit float16 (a weight beyond ±65504)")
    tmp = os.path.join(out, "model.safetensors.tmp")
    save_file(t, tmp, metadata={"format": "pt", "trained_by": "specactor training/train_dflash.py"})
    os.replace(tmp, os.path.join(out, "model.safetensors"))
    config = {"architectures": ["DSparkDraftModel" if heads is not None else "DFlashDraftModel"],
              "model_type": "qwen3", "hidden_size": cfg["H"],
              "intermediate_size": cfg["F"], "num_hidden_layers": cfg["layers"], "num_attention_heads": cfg["nh"],
              "num_key_value_heads": cfg["nkv"], "head_dim": cfg["hd"], "rms_norm_eps": cfg["eps"],
              "rope_theta": cfg["rope_theta"], "vocab_size": cfg["V"], "num_target_layers": cfg["target_layers"],
              "attention_bias": False, "torch_dtype": "float16",
              "dflash_config": {"block_size": cfg["block"], "mask_token_id": cfg["mask"],
                                "target_layer_ids": cfg["target_layer_ids"]},
              "specactor": info}
    if heads is not None:
        config["dspark_config"] = dict(config.pop("dflash_config"), markov_rank=cfg["rank"],
                                       markov_first_row=cfg["markov_first_row"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description="train a DFlash block drafter on `specactor make-data` output")
    ap.add_argument("--data", required=True, nargs="+", help="the make-data folder(s), of one target")
    ap.add_argument("--out", required=True, help="the drafter folder to write (config.json + model.safetensors)")
    ap.add_argument("--work", default="", help="checkpoints and the loss log (default: OUT.work)")
    ap.add_argument("--block-size", type=int, default=None,
                    help="tokens per block: the root and B-1 drafts (default 8; with --backbone, the backbone's: "
                         "given, the block the heads train on, e.g. the engine's pass of the root and 3 mask rows "
                         "at --speculative-num-steps 3)")
    ap.add_argument("--layers", type=int, default=1, help="decoder layers")
    ap.add_argument("--intermediate-size", type=int, default=0, help="MLP width (default: the target's)")
    ap.add_argument("--mask-token-id", type=int, default=DEFAULT_MASK,
                    help=f"the token that fills the block's draft positions (default {DEFAULT_MASK}, SmolLM2's "
                         "reserved <empty_output>)")
    ap.add_argument("--draft-vocab", type=int, default=4096, help="target ids the drafter scores (most frequent)")
    ap.add_argument("--pos-decay", type=float, default=0.85, help="weight of block row k is DECAY^(k-1)")
    ap.add_argument("--anchors-per-token", type=float, default=0.125,
                    help="blocks per sample = this x the batch's padded length (default 1/8)")
    ap.add_argument("--epochs", type=float, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=float, default=0.03)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--eval-share", type=float, default=0.05)
    ap.add_argument("--max-samples", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work")
    ap.add_argument("--dspark", action="store_true", help="train a DSpark drafter (Markov and confidence heads)")
    ap.add_argument("--backbone", default="", help="DSpark: start the backbone and draft vocabulary from this "
                                                  "trained DFlash drafter folder (its layers, mask token and, without --block-size, block)")
    ap.add_argument("--freeze-backbone", action="store_true", help="DSpark with --backbone: train the heads only")
    ap.add_argument("--init-from-target", default="", metavar="GGUF",
                    help="DFlash: start the decoder layers from these layers of the target's GGUF (llama), fc and "
                         "the norms to match (see --init-layers)")
    ap.add_argument("--init-layers", default="",
                    help="with --init-from-target: comma-separated target layer ids, one per drafter layer "
                         "(default: the layers right after the last capture layer, or the target's last ones where it ends first)")
    ap.add_argument("--markov-rank", type=int, default=64, help="DSpark: the Markov head's rank")
    ap.add_argument("--no-markov-first-row", dest="markov_first_row", action="store_false",
                    help="DSpark: no Markov term on the first draft row (its token before is the root, which the "
                         "block already reads), so the first draft is the backbone's own")
    ap.add_argument("--ce-weight", type=float, default=0.1, help="DSpark: weight of the soft cross-entropy")
    ap.add_argument("--tvd-weight", type=float, default=0.9, help="DSpark: weight of the total variation distance")
    ap.add_argument("--conf-weight", type=float, default=1.0, help="DSpark: weight of the confidence's loss")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    block_given = a.block_size is not None
    if not block_given:
        a.block_size = 8
    for name, ok in [("--block-size", 2 <= a.block_size <= 64), ("--layers", 1 <= a.layers <= 8),
                     ("--intermediate-size", a.intermediate_size >= 0), ("--draft-vocab", a.draft_vocab >= 2),
                     ("--pos-decay", 0 < a.pos_decay <= 1), ("--anchors-per-token", 0 < a.anchors_per_token <= 1),
                     ("--epochs", a.epochs > 0), ("--lr", a.lr > 0), ("--batch-tokens", a.batch_tokens >= 64),
                     ("--max-len", a.max_len >= 8), ("--eval-share", 0 <= a.eval_share < 1),
                     ("--warmup", 0 <= a.warmup < 1), ("--log-every", a.log_every >= 1),
                     ("--markov-rank", 1 <= a.markov_rank <= 4096), ("--ce-weight", a.ce_weight >= 0),
                     ("--tvd-weight", a.tvd_weight >= 0), ("--conf-weight", a.conf_weight >= 0)]:
        if not ok:
            fail(f"{name}: out of range")
    for name, given in [("--backbone", bool(a.backbone)), ("--freeze-backbone", a.freeze_backbone),
                        ("--no-markov-first-row", not a.markov_first_row)]:
        if given and not a.dspark:
            fail(f"{name}: only applies with --dspark")
    if a.freeze_backbone and not a.backbone:
        fail("--freeze-backbone: needs --backbone (a trained DFlash drafter to keep)")
    if a.init_from_target and a.dspark:
        fail("--init-from-target: DFlash only (DSpark starts from a trained DFlash drafter: --backbone)")
    if a.init_layers and not a.init_from_target:
        fail("--init-layers: only applies with --init-from-target")
    work = a.work or (a.out.rstrip("/") + ".work")
    try:
        ds = Dataset(a.data, a.max_samples)
    except DataError as e:
        fail(str(e))
    m = ds.model
    if not 0 <= a.mask_token_id < m["vocab_size"]:
        fail(f"--mask-token-id: {a.mask_token_id} is outside the target's vocabulary of {m['vocab_size']}")

    import jax
    import jax.numpy as jnp
    import optax
    from tqdm import tqdm

    ckpt = os.path.join(work, "checkpoint.npz")
    resuming = a.resume and os.path.exists(ckpt)
    cfg = {"H": m["hidden_size"], "F": a.intermediate_size or m["intermediate_size"], "nh": m["num_attention_heads"],
           "nkv": m["num_key_value_heads"], "hd": m["head_dim"], "eps": m["rms_norm_eps"],
           "rope_theta": m["rope_theta"], "V": m["vocab_size"], "layers": a.layers, "block": a.block_size,
           "mask": a.mask_token_id, "K": len(ds.aux_layers), "target_layer_ids": list(ds.aux_layers),
           "target_layers": m["num_hidden_layers"], "rank": a.markov_rank, "markov_first_row": a.markov_first_row}
    init_layers = []
    if a.init_from_target:
        if not os.path.isfile(a.init_from_target):
            fail(f"--init-from-target: {a.init_from_target}: no such file")
        try:
            # Default: the layers right after the last capture layer; where the target ends before that
            # many, its last --layers layers.
            first = min(max(ds.aux_layers) + 1, m["num_hidden_layers"] - a.layers)
            init_layers = ([int(x) for x in a.init_layers.split(",")] if a.init_layers else
                           [first + i for i in range(a.layers)])
        except ValueError:
            fail(f"--init-layers: expected comma-separated layer ids, got '{a.init_layers}'")
        if a.layers > m["num_hidden_layers"] and not a.init_layers:
            fail(f"--init-from-target: the drafter's {a.layers} layers (--layers) are more than the target's "
                 f"{m['num_hidden_layers']}; give --init-layers, or start at random (no --init-from-target)")
        if len(init_layers) != a.layers:
            fail(f"--init-layers: {len(init_layers)} id(s) for {a.layers} drafter layer(s) (--layers)")
        bad = [x for x in init_layers if not 0 <= x < m["num_hidden_layers"]]
        if bad:
            fail(f"--init-layers: {bad[0]} is not a layer of the target (0 .. {m['num_hidden_layers'] - 1})")
    backbone, fixed = None, None
    if a.backbone:  # its block, layers, mask token and draft vocabulary replace the flags'
        backbone, fixed = load_backbone(a.backbone, cfg, fail)
        if block_given:  # a block other than the backbone's trained one (the engine's shorter pass)
            cfg["block"] = a.block_size
        a.draft_vocab, a.block_size = len(fixed), cfg["block"]
    try:
        if resuming:
            fixed = np.load(ckpt, allow_pickle=False)["draft_ids"]
        ids, _, t2d, covered = select_vocab(ds, a.draft_vocab, fixed)
    except (DataError, KeyError, ValueError, OSError) as e:
        fail(f"{ckpt}: cannot resume from it ({e}); delete it or drop --resume")
    cfg["QD"], cfg["KD"], cfg["Vd"] = cfg["nh"] * cfg["hd"], cfg["nkv"] * cfg["hd"], len(ids)
    eval_idx, train_idx = held_out_split(ds, a.eval_share, a.seed)
    buckets = [b for b in (64, 128, 192, 256, 320, 384, 512, 768, 1024) if b < a.max_len] + [a.max_len]
    n_batches = len(batches(ds, train_idx, a.batch_tokens, np.random.default_rng(0), buckets))
    total_steps = max(1, int(math.ceil(n_batches * a.epochs)))
    if a.max_steps:
        total_steps = min(total_steps, a.max_steps)
    print(f"train_dflash: {'DSpark' if a.dspark else 'DFlash'}"
          f"{' heads on a frozen backbone' if a.freeze_backbone else ''}; "
          f"{len(ds)} samples ({len(train_idx)} train, {len(eval_idx)} held out), "
          f"{int(ds.offsets[-1])} tokens; block {cfg['block']}, {cfg['layers']} layer(s), target layers "
          f"{cfg['target_layer_ids']}, mask token {cfg['mask']}; draft vocabulary {len(ids)} covers "
          f"{100 * covered:.1f}% of trained next tokens; {total_steps} steps of ~{a.batch_tokens} tokens", flush=True)

    warm = max(1, int(total_steps * a.warmup))
    sched = optax.warmup_cosine_decay_schedule(0.0, a.lr, warm, max(total_steps, warm + 1),
                                               end_value=a.lr * 0.05)
    tx = optax.chain(optax.clip_by_global_norm(a.clip), optax.adamw(sched, weight_decay=a.weight_decay))
    embed = jnp.asarray(ds.embed)
    head_d = jnp.asarray(ds.lm_head[ids].T)  # [H, Vd]
    tgt_norm = jnp.asarray(ds.output_norm)
    in_vocab = jnp.asarray(t2d.astype(np.float32))
    params = init_params(jax.random.PRNGKey(a.seed), cfg, ds.output_norm.copy())
    if init_layers and not resuming:
        params = jax.tree_util.tree_map(jnp.asarray, target_init(a.init_from_target, init_layers, cfg, ds, fail))
    if backbone is not None:
        params = jax.tree_util.tree_map(jnp.asarray, backbone)
    trainable, frozen = {"bb": params}, {}
    if a.dspark:
        trainable["heads"] = init_heads(jax.random.PRNGKey(a.seed + 1), cfg)
        if a.freeze_backbone:
            frozen["bb"] = trainable.pop("bb")
    opt_state = tx.init(trainable)
    step, history = 0, []
    os.makedirs(work, exist_ok=True)
    # What the checkpoint's numbers mean: resuming under other values would train another objective
    # with no error (shapes alone do not show them). --epochs, --lr and the like may change.
    settings = {"--block-size": cfg["block"], "--layers": cfg["layers"], "--pos-decay": a.pos_decay,
                "--mask-token-id": cfg["mask"], "--dspark": a.dspark, "--freeze-backbone": a.freeze_backbone,
                "--markov-rank": a.markov_rank if a.dspark else None,
                "--no-markov-first-row": (not a.markov_first_row) if a.dspark else None,
                "--ce-weight": a.ce_weight if a.dspark else None, "--tvd-weight": a.tvd_weight if a.dspark else None,
                "--conf-weight": a.conf_weight if a.dspark else None}
    if resuming:
        try:
            z = np.load(ckpt, allow_pickle=False)
            if "settings" in z.files:  # checkpoints before 2026-12-07 19:50 UTC carry none
                before = json.loads(str(z["settings"]))
                for flag, value in settings.items():
                    if flag in before and before[flag] != value:
                        raise DataError(f"it was trained with {flag} {before[flag]}, this run has {value}")
            leaves, treedef = jax.tree_util.tree_flatten((trainable, opt_state))
            loaded = [z[f"l{i}"] for i in range(len(leaves))]
            for i, (x, y) in enumerate(zip(leaves, loaded)):
                if np.shape(x) != y.shape:
                    raise DataError(f"leaf {i} has shape {y.shape}, expected {np.shape(x)} (other settings?)")
            trainable, opt_state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(v) for v in loaded])
            step, history = int(z["step"]), json.loads(str(z["history"]))
            print(f"train_dflash: resumed from {ckpt} at step {step}", flush=True)
        except (DataError, KeyError, ValueError, OSError) as e:
            fail(f"{ckpt}: cannot resume from it ({e}); delete it or drop --resume")
    elif a.resume:
        print(f"train_dflash: no checkpoint in {work}; starting fresh", flush=True)

    def save():
        leaves, _ = jax.tree_util.tree_flatten((trainable, opt_state))
        tmp = ckpt + ".tmp.npz"
        np.savez(tmp, step=step, draft_ids=ids, history=json.dumps(history), settings=json.dumps(settings),
                 **{f"l{i}": np.asarray(x) for i, x in enumerate(leaves)})
        os.replace(tmp, ckpt)

    mix = (a.ce_weight, a.tvd_weight, a.conf_weight) if a.dspark else None
    train_step, eval_fn = build_fns(cfg, tx, a.pos_decay, mix)
    stop = {"now": False}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.update(now=True))

    def batch_of(bi, T, rng):
        tok, lm, am, aux, last, valid = make_batch(ds, bi, T)
        anc = anchors(lm, valid, max(1, int(round(T * a.anchors_per_token))), rng)
        return tok, lm, am, aux, last, valid, anc, in_vocab

    def evaluate():
        if not eval_idx:
            return None
        rng = np.random.default_rng(12345)  # the same anchors every time
        acc, counted, total, ce_sum, ce_n = np.zeros(a.block_size - 1), 0, 0.0, 0.0, 0.0
        confs, flags = [], []
        for bi, T in batches(ds, eval_idx, a.batch_tokens, np.random.default_rng(0), buckets):
            b = batch_of(bi, T, rng)
            _, (pred, mask, ce, conf) = eval_fn(trainable, frozen, embed, head_d, tgt_norm, b)
            mask = np.asarray(mask)
            ce_sum += float(np.sum(np.asarray(ce) * mask)); ce_n += float(mask.sum())
            ac, n, tot, fl = block_accepted(b[0], b[2], b[6], np.asarray(pred), mask, ids, a.block_size)
            acc += ac; counted += n; total += tot
            if conf is not None:
                confs.append(np.asarray(conf).reshape(-1, a.block_size - 1))
                flags.append(fl.reshape(-1, a.block_size - 1))
        by_pos = (acc / max(counted, 1)).round(4).tolist()  # P(drafts 1..k all accepted)
        ev = {"accepted_by_position": by_pos, "ce": round(ce_sum / max(ce_n, 1), 4),
              "tau_est": round(1 + total / max(counted, 1), 3), "anchors": counted}
        if confs:
            ev["confidence"] = calibration(np.concatenate(confs), np.concatenate(flags))
        return ev

    t0 = time.time()
    epoch = step // max(1, n_batches)
    bar = tqdm(total=total_steps, initial=step, disable=a.quiet, unit="step", dynamic_ncols=True,
               mininterval=0.1 if sys.stderr.isatty() else 30)
    run_loss, run_n = 0.0, 0
    while step < total_steps and not stop["now"]:
        erng = np.random.default_rng(a.seed * 1000 + epoch)
        plan = batches(ds, train_idx, a.batch_tokens, erng, buckets)
        skip = step - epoch * n_batches
        for bi, T in plan[max(0, skip):]:
            if step >= total_steps or stop["now"]:
                break
            batch = batch_of(bi, T, np.random.default_rng(a.seed * 1000003 + step))
            trainable, opt_state, loss = train_step(trainable, frozen, opt_state, embed, head_d, tgt_norm, batch)
            step += 1
            run_loss += float(loss); run_n += 1
            if step % a.log_every == 0 or step == total_steps:
                history.append({"step": step, "epoch": round(step / n_batches, 3), "loss": run_loss / run_n,
                                "lr": float(sched(step)), "elapsed_s": round(time.time() - t0, 1)})
                bar.set_postfix(loss=f"{run_loss / run_n:.3f}")
                run_loss, run_n = 0.0, 0
            bar.update(1)
            if step % 200 == 0:
                save()
        epoch += 1
        if not stop["now"]:
            ev = evaluate()
            if ev:
                history.append({"step": step, "epoch": round(step / n_batches, 3), "eval": ev})
                tqdm.write(f"epoch {epoch}: held-out τ estimate {ev['tau_est']}, all of drafts 1..k accepted "
                           f"{ev['accepted_by_position']}"
                           + (f"; confidence calibration error {ev['confidence']['ece']}"
                              if ev.get("confidence") else ""))
            save()
    bar.close()
    save()
    with open(os.path.join(work, "history.json"), "w") as f:
        json.dump(history, f, indent=1)
    write_chart(history, os.path.join(work, "loss.svg"),
                "training loss (" + ("CE, TVD and confidence, weighted" if a.dspark else
                                     "position-weighted soft cross-entropy") + ")",
                "held-out τ estimate (the block's chain)")
    if stop["now"]:
        print(f"train_dflash: interrupted at step {step}; rerun with --resume to continue", flush=True)
        sys.exit(130)
    last = next((h["eval"] for h in reversed(history) if "eval" in h), None)
    info = {"steps": step, "samples": len(ds), "draft_vocab": len(ids), "pos_decay": a.pos_decay,
            "held_out": last}
    if init_layers:
        info["initialised_from_target_layers"] = init_layers
    if a.dspark:
        info.update(loss_weights={"ce": a.ce_weight, "tvd": a.tvd_weight, "confidence": a.conf_weight},
                    backbone=os.path.basename(a.backbone.rstrip("/")) if a.backbone else None,
                    frozen_backbone=a.freeze_backbone)
    both = jax.tree_util.tree_map(np.asarray, {**frozen, **trainable})
    export(both["bb"], cfg, ids, a.out, info, both.get("heads"))
    print(f"train_dflash: wrote {a.out} after {step} steps in {time.time() - t0:.0f} s"
          + (f"; held-out τ estimate {last['tau_est']}, all of drafts 1..k accepted {last['accepted_by_position']}"
             if last else ""), flush=True)


if __name__ == "__main__":
    main()
