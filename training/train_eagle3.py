#!/usr/bin/env python3
"""Trains an EAGLE-3 draft head on data written by `specactor make-data`, and exports it in the
Hugging Face EAGLE-3 layout that specactor (and sglang) load.

    .venv-train/bin/python training/train_eagle3.py --data data/eagle3/run1 --out models/eagle3-smollm2 \
        [--epochs 4] [--draft-vocab 8192] [--ttt-steps 3] [--lr 1.5e-3] [--batch-tokens 1024] [--resume]

The model (matching model/head_model.cpp's EAGLE3 forward, row for row):
  the pair at position p+1 is (token t[p+1], feature f[p]); f = fc([h_a; h_b; h_c]) (3H -> H) of the
  three captured target layers at step 0, the head's own previous output afterwards;
  x = f; a = attention([input_layernorm(embed(t)); hidden_norm(f)]) (2H inputs, RoPE neox);
  x = x + o(a); x = x + mlp(post_attention_layernorm(x)); logits = lm_head(norm(x)) over the draft
  vocabulary (d2t maps draft ids to target ids).
Objective: training-time test over --ttt-steps steps. Step k at pair p consumes token t[p+1+k] and
step k-1's output, attends to step 0's keys of pairs <= p plus its own chain (steps 1..k at p), and
is scored by the soft cross-entropy against the target's next-token distribution at position p+1+k
restricted to the draft vocabulary, weighted 0.8^k (--ttt-decay), plus --hard-weight times the
cross-entropy against the target's argmax (0 by default). Positions whose next token is not a response
token, or whose target argmax is outside the draft vocabulary, are masked.

Everything is float32 on the CPU (JAX from PyPI, pinned in training/requirements-train.txt).
"""
import argparse
import hashlib
import json
import math
import os
import signal
import sys
import time

import numpy as np

FORMAT = "specactor-eagle3-data"


class DataError(Exception):
    pass


def fail(msg):
    print(f"train_eagle3: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------- data


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a JSON {what} ({e})")


def load_safetensors(path, names=None):
    from safetensors import safe_open

    if not os.path.exists(path):
        raise DataError(f"{path}: not found")
    try:
        out = {}
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            for k in f.keys() if names is None else names:
                if k not in f.keys():
                    raise DataError(f"{path}: missing tensor '{k}'")
                out[k] = f.get_tensor(k)
        return out, meta
    except DataError:
        raise
    except Exception as e:  # a torn or corrupt file
        raise DataError(f"{path}: cannot read ({e}); rerun `specactor make-data` with the same flags to rewrite it")


class Dataset:
    """All shards in memory: concatenated tokens and features, sample offsets."""

    def __init__(self, folders, max_samples=0):
        if isinstance(folders, str):
            folders = [folders]
        toks, mask, amax, aux, last, offs = [], [], [], [], [], [0]
        n = 0
        self.manifest = None
        for folder in folders:
            m = self._manifest(folder)
            if self.manifest is None:
                self.manifest, self.model, self.aux_layers = m, m["model"], m["target"]["aux_layers"]
                H = self.model["hidden_size"]
                tgt, _ = load_safetensors(os.path.join(folder, "target.safetensors"), ["embed", "lm_head", "output_norm"])
                if tgt["embed"].shape != (self.model["vocab_size"], H):
                    raise DataError(f"{folder}/target.safetensors: embed is {tgt['embed'].shape}, the manifest says "
                                    f"({self.model['vocab_size']}, {H}) (a file from another model?)")
                self.embed = tgt["embed"].astype(np.float32)
                self.lm_head = tgt["lm_head"].astype(np.float32)
                self.output_norm = tgt["output_norm"].astype(np.float32)
            elif m["target"]["fingerprint"] != self.manifest["target"]["fingerprint"] or \
                    m["target"]["aux_layers"] != self.aux_layers:
                raise DataError(f"{folder}: made from another target or capture layers than {folders[0]} (target "
                                f"{m['target']['fingerprint']} layers {m['target']['aux_layers']} vs "
                                f"{self.manifest['target']['fingerprint']} layers {self.aux_layers}); "
                                f"train on one target's data")
            fp = m["target"]["fingerprint"]
            H = self.model["hidden_size"]
            for sh in m["shards"]:
                if max_samples and n >= max_samples:
                    break
                path = os.path.join(folder, sh["file"])
                t, meta = load_safetensors(path)
                if meta.get("format") != FORMAT or meta.get("target_fingerprint") != fp:
                    raise DataError(f"{path}: made from another target (fingerprint {meta.get('target_fingerprint')}, "
                                    f"the manifest's {fp}); use one folder per target")
                if t["aux_hidden"].shape[1] != 3 * H or t["last_hidden"].shape[1] != H:
                    raise DataError(f"{path}: hidden states of width {t['aux_hidden'].shape[1]}/"
                                    f"{t['last_hidden'].shape[1]}, expected {3 * H}/{H}")
                o = t["offsets"]
                if o[0] != 0 or o[-1] != len(t["tokens"]) or np.any(np.diff(o) <= 0):
                    raise DataError(f"{path}: offsets do not cover the tokens")
                base = offs[-1]
                toks.append(t["tokens"]); mask.append(t["loss_mask"]); amax.append(t["target_argmax"])
                aux.append(t["aux_hidden"]); last.append(t["last_hidden"])
                offs.extend((base + o[1:]).tolist())
                n += len(o) - 1
        if n == 0:
            raise DataError(f"{', '.join(folders)}: no samples")
        self.tokens = np.concatenate(toks).astype(np.int32)
        self.loss_mask = np.concatenate(mask).astype(np.uint8)
        self.argmax = np.concatenate(amax).astype(np.int32)
        self.aux = np.concatenate(aux)  # f16
        self.last = np.concatenate(last)  # f16
        self.offsets = np.array(offs, dtype=np.int64)
        if max_samples:
            self.offsets = self.offsets[: max_samples + 1]
        if np.any(self.tokens < 0) or np.any(self.tokens >= self.model["vocab_size"]):
            raise DataError(f"{', '.join(folders)}: token ids outside the vocabulary of {self.model['vocab_size']}")

    @staticmethod
    def _manifest(folder):
        mpath = os.path.join(folder, "manifest.json")
        if not os.path.exists(mpath):
            raise DataError(f"{mpath}: not found (write the data with `specactor make-data --out {folder}` first)")
        m = read_json(mpath, "manifest")
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise DataError(f"{mpath}: format is {m.get('format') if isinstance(m, dict) else None!r}, "
                            f"expected {FORMAT!r}")
        if not m.get("complete"):
            raise DataError(f"{mpath}: the data is incomplete (rerun the same `specactor make-data` command)")
        return m

    def __len__(self):
        return len(self.offsets) - 1

    def sample(self, i):
        a, b = self.offsets[i], self.offsets[i + 1]
        return a, b


def select_vocab(ds, size, fixed=None):
    """The draft vocabulary: the most frequent next tokens at trained positions (or `fixed`, a resumed
    checkpoint's, so that data extended since keeps the head's vocabulary); d2t offsets, t2d mask."""
    V = ds.model["vocab_size"]
    size = min(size, V)
    counts = np.bincount(ds.tokens[ds.loss_mask == 1], minlength=V).astype(np.float64)
    counts += 1e-3 * np.bincount(ds.tokens, minlength=V)  # then tokens seen anywhere
    if fixed is not None:
        ids = np.sort(np.asarray(fixed, dtype=np.int64))
        if len(ids) != size or len(np.unique(ids)) != size or ids[0] < 0 or ids[-1] >= V:
            raise DataError(f"its draft vocabulary ({len(ids)} ids) does not fit --draft-vocab {size} and "
                            f"this target's {V} tokens (another --draft-vocab or target?)")
    else:
        ids = np.sort(np.argsort(-counts, kind="stable")[:size])
    covered = counts[ids].sum() / max(counts.sum(), 1)
    d2t = (ids - np.arange(size)).astype(np.int64)
    t2d = np.zeros(V, dtype=bool)
    t2d[ids] = True
    return ids.astype(np.int32), d2t, t2d, covered


def held_out_split(ds, share, seed=0):
    """(held-out indices, training indices). A sample is held out when a hash of its tokens (and the
    seed) falls below `share`: membership depends on the sample alone, so data extended later (or
    reordered) keeps every old sample on its side and a resumed checkpoint never sees held-out text.
    Identical samples land together. At least one sample is held out when share > 0 and n > 1."""
    n = len(ds)
    if share <= 0 or n < 2:
        return [], list(range(n))
    keys = np.empty(n)
    for i in range(n):
        a, b = ds.sample(i)
        h = hashlib.blake2b(ds.tokens[a:b].astype("<i4").tobytes(), digest_size=8, key=str(seed).encode())
        keys[i] = int.from_bytes(h.digest(), "little") / 2.0 ** 64
    held = keys < share
    if not held.any():
        held[int(np.argmin(keys))] = True
    if held.all():
        held[int(np.argmax(keys))] = False
    return np.flatnonzero(held).tolist(), np.flatnonzero(~held).tolist()


def batches(ds, indices, budget, rng, buckets):
    """Groups samples of similar length into (B, T) batches of about `budget` tokens."""
    lens = np.array([ds.offsets[i + 1] - ds.offsets[i] for i in indices])
    order = np.array(indices)[np.argsort(lens + rng.random(len(lens)), kind="stable")]
    out, cur, cur_t = [], [], 0
    for i in order:
        L = int(ds.offsets[i + 1] - ds.offsets[i])
        T = next(b for b in buckets if b >= min(L, buckets[-1]))
        if cur and (T != cur_t or (len(cur) + 1) * T > budget):
            out.append((cur, cur_t))
            cur = []
        cur.append(i)
        cur_t = T
    if cur:
        out.append((cur, cur_t))
    rng.shuffle(out)
    return out


def make_batch(ds, ids, T):
    B = len(ids)
    H = ds.model["hidden_size"]
    tok = np.zeros((B, T), np.int32)
    lm = np.zeros((B, T), np.float32)
    am = np.zeros((B, T), np.int32)
    aux = np.zeros((B, T, 3 * H), np.float32)
    last = np.zeros((B, T, H), np.float32)
    valid = np.zeros((B, T), np.float32)
    for r, i in enumerate(ids):
        a, b = ds.offsets[i], ds.offsets[i + 1]
        n = min(int(b - a), T)
        tok[r, :n] = ds.tokens[a:a + n]
        lm[r, :n] = ds.loss_mask[a:a + n]
        am[r, :n] = ds.argmax[a:a + n]
        aux[r, :n] = ds.aux[a:a + n]
        last[r, :n] = ds.last[a:a + n]
        valid[r, :n] = 1
    return tok, lm, am, aux, last, valid


def chain_accepted(tok, lm, am, valid, preds, ids):
    """Greedy chain acceptance as the engine counts it, on teacher-forced data: at pair p (committed
    prefix ending with token t[p+1]) draft k is accepted when drafts 0..k-1 were, the head's choice
    (a draft id, mapped to a target id) equals the target's argmax at position p+1+k, and the data's
    next token is that argmax (so the teacher-forced input equals what the engine would feed; false
    on sampled responses where the sample left the argmax). Returns (sum of accepted lengths, pairs):
    pairs are those whose next token is a response token."""
    B, T = tok.shape
    Tp = T - 1
    base = (lm[:, 2:] * valid[:, 2:] > 0)  # [B, T-2]: pair p = 0 .. T-3 predicts a response token
    alive = base.copy()
    total = np.zeros(base.shape)
    w = Tp - 1  # pairs with a defined next token at step 0
    for k, pred in enumerate(preds):
        pos = np.arange(w) + 1 + k  # the position whose argmax draft k must equal
        ok = np.zeros(base.shape, bool)
        inb = pos < T - 1  # the token after pos exists
        pk = pos[inb]
        drafted = ids[pred[:, :w][:, inb]]
        ok[:, inb] = (drafted == am[:, pk]) & (tok[:, pk + 1] == am[:, pk]) & (valid[:, pk + 1] > 0)
        alive &= ok
        total += alive
    return float(total[base].sum()), float(base.sum())


# --------------------------------------------------------------------------------------------- model


def init_params(key, cfg, lm_head_init, norm_init):
    import jax
    import jax.numpy as jnp

    H, F, QD, KD, Vd = cfg["H"], cfg["F"], cfg["QD"], cfg["KD"], cfg["Vd"]
    ks = jax.random.split(key, 8)

    def lin(k, i, o):
        return jax.random.normal(k, (i, o), jnp.float32) * (1.0 / math.sqrt(i))

    return {
        "fc": lin(ks[0], 3 * H, H),
        "input_layernorm": jnp.ones((H,), jnp.float32),
        "hidden_norm": jnp.ones((H,), jnp.float32),
        "q": lin(ks[1], 2 * H, QD),
        "k": lin(ks[2], 2 * H, KD),
        "v": lin(ks[3], 2 * H, KD),
        "o": lin(ks[4], QD, H) * 0.1,
        "post_attention_layernorm": jnp.ones((H,), jnp.float32),
        "gate": lin(ks[5], H, F),
        "up": lin(ks[6], H, F),
        "down": lin(ks[7], F, H) * 0.1,
        "norm": jnp.asarray(norm_init),
        "lm_head": jnp.asarray(lm_head_init),  # [H, Vd]
    }


# The parameters in the order a dict of them flattens (sorted keys): the checkpoint's leaf order.
PARAM_NAMES = sorted(["fc", "input_layernorm", "hidden_norm", "q", "k", "v", "o", "post_attention_layernorm", "gate",
                      "up", "down", "norm", "lm_head"])


def build_step_fns(cfg, ttt_steps, tx, ttt_decay=0.8, hard_weight=0.0):
    import jax
    import jax.numpy as jnp

    H, nh, nkv, hd, eps = cfg["H"], cfg["nh"], cfg["nkv"], cfg["hd"], cfg["eps"]
    groups = nh // nkv
    half = hd // 2
    inv = cfg["rope_theta"] ** (-2.0 * np.arange(half) / hd)

    def rms(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x, pos):  # x [B, T, h, hd], pos [T]
        ang = pos[:, None].astype(jnp.float32) * inv[None, :].astype(jnp.float32)
        c, s = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return jnp.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)

    def loss_fn(p, embed, tgt_head, tgt_norm, batch):
        tok, lm, am, aux, last, valid, in_vocab = batch
        B, T = tok.shape
        Tp = T - 1  # pairs p = 0 .. T-2
        scale = 1.0 / math.sqrt(hd)
        pos0 = jnp.arange(Tp) + 1
        # The target's distribution over the draft vocabulary at every position.
        tlog = rms(last, tgt_norm) @ tgt_head  # [B, T, Vd]
        tprob = jax.lax.stop_gradient(jax.nn.softmax(tlog, axis=-1))
        causal = jnp.tril(jnp.ones((Tp, Tp), bool))
        x = aux[:, :-1] @ p["fc"]
        K0 = V0 = None
        chain_k, chain_v = [], []
        total, stats = 0.0, []
        for k in range(ttt_steps):
            # step k at pair p: token t[p+1+k], position p+1+k, predicts t[p+2+k]
            tk = jnp.concatenate([tok[:, 1 + k:], jnp.zeros((B, k), tok.dtype)], axis=1)[:, :Tp]
            emb = embed[tk]
            h_in = jnp.concatenate([rms(emb, p["input_layernorm"]), rms(x, p["hidden_norm"])], axis=-1)
            q = (h_in @ p["q"]).reshape(B, Tp, nh, hd)
            kk = (h_in @ p["k"]).reshape(B, Tp, nkv, hd)
            vv = (h_in @ p["v"]).reshape(B, Tp, nkv, hd)
            pos = pos0 + k
            q, kk = rope(q, pos), rope(kk, pos)
            kk = jnp.repeat(kk, groups, axis=2)
            vv = jnp.repeat(vv, groups, axis=2)
            if k == 0:
                K0, V0 = kk, vv
            else:
                chain_k.append(kk)
                chain_v.append(vv)
            s0 = jnp.einsum("bqhd,bkhd->bhqk", q, K0) * scale
            s0 = jnp.where(causal[None, None], s0, -1e30)
            diag = [jnp.einsum("bqhd,bqhd->bhq", q, ck)[..., None] * scale for ck in chain_k]
            s = jnp.concatenate([s0] + diag, axis=-1)
            a = jax.nn.softmax(s, axis=-1)
            att = jnp.einsum("bhqk,bkhd->bqhd", a[..., :Tp], V0)
            for j, cv in enumerate(chain_v):
                att = att + a[..., Tp + j].transpose(0, 2, 1)[..., None] * cv
            x = x + att.reshape(B, Tp, nh * hd) @ p["o"]
            hmid = rms(x, p["post_attention_layernorm"])
            x = x + (jax.nn.silu(hmid @ p["gate"]) * (hmid @ p["up"])) @ p["down"]
            logits = rms(x, p["norm"]) @ p["lm_head"]  # [B, Tp, Vd]
            logp = jax.nn.log_softmax(logits, axis=-1)
            # target at position p+1+k (predicting t[p+2+k])
            tp = jnp.concatenate([tprob[:, 1 + k:], jnp.zeros((B, k, tprob.shape[-1]))], axis=1)[:, :Tp]
            nxt_lm = jnp.concatenate([lm[:, 2 + k:], jnp.zeros((B, k + 1))], axis=1)[:, :Tp]
            nxt_ok = jnp.concatenate([valid[:, 2 + k:], jnp.zeros((B, k + 1))], axis=1)[:, :Tp]
            tam = jnp.concatenate([am[:, 1 + k:], jnp.zeros((B, k), am.dtype)], axis=1)[:, :Tp]
            m = nxt_lm * nxt_ok * in_vocab[tam]
            ce = -jnp.sum(tp * logp, axis=-1)
            n = jnp.maximum(jnp.sum(m), 1.0)
            top = jnp.argmax(tp, axis=-1)
            obj = ce
            if hard_weight:  # the target's argmax as a one-hot label: greedy acceptance is argmax agreement
                obj = ce - hard_weight * jnp.take_along_axis(logp, top[..., None], axis=-1)[..., 0]
            total = total + (ttt_decay ** k) * jnp.sum(obj * m) / n
            pred = jnp.argmax(logits, axis=-1)
            hit = (pred == top).astype(jnp.float32)
            stats.append((jnp.sum(hit * m), jnp.sum(m), jnp.sum(ce * m), pred))
        return total, stats

    def train_step(p, opt_state, embed, tgt_head, tgt_norm, batch):
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, embed, tgt_head, tgt_norm, batch)
        updates, opt_state = tx.update(grads, opt_state, p)
        import optax

        p = optax.apply_updates(p, updates)
        return p, opt_state, loss, [st[:3] for st in stats]

    def eval_step(p, embed, tgt_head, tgt_norm, batch):
        return loss_fn(p, embed, tgt_head, tgt_norm, batch)

    return jax.jit(train_step), jax.jit(eval_step)


def read_head_folder(path, ds):
    """An exported head (config.json + model.safetensors, as `export` writes and specactor ships) as
    trainer parameters {name: [in, out] float32} and its draft vocabulary (target ids)."""
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    cpath, spath = os.path.join(folder, "config.json"), os.path.join(folder, "model.safetensors")
    if not os.path.exists(cpath) or not os.path.exists(spath):
        raise DataError(f"{folder}: expected config.json and model.safetensors (an EAGLE-3 head folder)")
    c = read_json(cpath, "config")
    if "LlamaForCausalLMEagle3" not in (c.get("architectures") or []):
        raise DataError(f"{cpath}: architectures {c.get('architectures')}, expected LlamaForCausalLMEagle3")
    m = ds.model
    for key in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads"):
        if c.get(key) != m[key]:
            raise DataError(f"{cpath}: {key} {c.get(key)}, this data's target has {m[key]} (a head for another model)")
    layers = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if layers is not None and list(layers) != list(ds.aux_layers):
        raise DataError(f"{cpath}: captures layers {layers}, this data captured {ds.aux_layers} "
                        f"(make the data with `make-data --aux-layers {','.join(map(str, layers))}`)")
    names = {"fc": "fc.weight", "input_layernorm": "midlayer.input_layernorm.weight",
             "hidden_norm": "midlayer.hidden_norm.weight", "q": "midlayer.self_attn.q_proj.weight",
             "k": "midlayer.self_attn.k_proj.weight", "v": "midlayer.self_attn.v_proj.weight",
             "o": "midlayer.self_attn.o_proj.weight",
             "post_attention_layernorm": "midlayer.post_attention_layernorm.weight",
             "gate": "midlayer.mlp.gate_proj.weight", "up": "midlayer.mlp.up_proj.weight",
             "down": "midlayer.mlp.down_proj.weight", "norm": "norm.weight", "lm_head": "lm_head.weight"}
    t, _ = load_safetensors(spath, list(names.values()) + ["d2t"])
    params = {k: (t[v].astype(np.float32).T if t[v].ndim == 2 else t[v].astype(np.float32)) for k, v in names.items()}
    d2t = np.asarray(t["d2t"], dtype=np.int64)
    ids = np.arange(len(d2t), dtype=np.int64) + d2t
    if np.any(np.diff(ids) <= 0) or ids[0] < 0 or ids[-1] >= m["vocab_size"]:
        raise DataError(f"{spath}: d2t does not map the draft ids to increasing target ids")
    return params, ids


def grow_mlp(src, F, seed):
    """A wider MLP that computes the same function: the new gate/up columns start random, the new
    down rows zero (so they add nothing until trained)."""
    have = src["gate"].shape[1]
    if have == F:
        return src
    if have > F:
        raise DataError(f"its MLP is {have} wide, wider than --intermediate-size {F} (give {have} or more)")
    rng = np.random.default_rng(seed)
    H = src["gate"].shape[0]
    out = dict(src)
    for k in ("gate", "up"):
        extra = rng.standard_normal((H, F - have)).astype(np.float32) / math.sqrt(H)
        out[k] = np.concatenate([src[k], extra], axis=1)
    out["down"] = np.concatenate([src["down"], np.zeros((F - have, H), np.float32)], axis=0)
    return out


# -------------------------------------------------------------------------------------------- export


def export(params, cfg, ds, d2t, t2d, out):
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    m = ds.model
    p = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    f16 = lambda a: np.ascontiguousarray(a.astype(np.float16))
    tensors = {
        "fc.weight": f16(p["fc"].T),
        "midlayer.input_layernorm.weight": f16(p["input_layernorm"]),
        "midlayer.hidden_norm.weight": f16(p["hidden_norm"]),
        "midlayer.self_attn.q_proj.weight": f16(p["q"].T),
        "midlayer.self_attn.k_proj.weight": f16(p["k"].T),
        "midlayer.self_attn.v_proj.weight": f16(p["v"].T),
        "midlayer.self_attn.o_proj.weight": f16(p["o"].T),
        "midlayer.post_attention_layernorm.weight": f16(p["post_attention_layernorm"]),
        "midlayer.mlp.gate_proj.weight": f16(p["gate"].T),
        "midlayer.mlp.up_proj.weight": f16(p["up"].T),
        "midlayer.mlp.down_proj.weight": f16(p["down"].T),
        "norm.weight": f16(p["norm"]),
        "lm_head.weight": f16(p["lm_head"].T),
        "d2t": np.ascontiguousarray(d2t.astype(np.int64)),
        "t2d": np.ascontiguousarray(t2d.astype(bool)),
    }
    for k, v in tensors.items():
        if v.dtype != bool and not np.all(np.isfinite(v.astype(np.float64))):
            raise DataError(f"export: tensor {k} holds non-finite values (training diverged; lower --lr)")
    save_file(tensors, os.path.join(out, "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(os.path.join(out, "model.safetensors.tmp"), os.path.join(out, "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": m["hidden_size"],
        "intermediate_size": int(cfg["F"]),
        "num_attention_heads": m["num_attention_heads"],
        "num_key_value_heads": m["num_key_value_heads"],
        "head_dim": m["head_dim"],
        "num_hidden_layers": 1,
        "rms_norm_eps": m["rms_norm_eps"],
        "rope_theta": m["rope_theta"],
        "max_position_embeddings": m["max_position_embeddings"],
        "vocab_size": m["vocab_size"],
        "draft_vocab_size": int(len(d2t)),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ds.aux_layers)},
        "specactor": {"target": ds.manifest["target"]["name"],
                      "target_fingerprint": ds.manifest["target"]["fingerprint"],
                      "trained_samples": len(ds)},
    }
    with open(os.path.join(out, "config.json.tmp"), "w") as f:
        json.dump(config, f, indent=2)
    os.replace(os.path.join(out, "config.json.tmp"), os.path.join(out, "config.json"))


def write_chart(history, path, loss_label="training loss (TTT-weighted soft cross-entropy)",
                tau_label="held-out τ estimate (chain of the TTT depth)"):
    """An SVG of the training loss per logged step and the held-out τ estimate per epoch (no plotting library)."""
    pts = [(h["step"], h["loss"]) for h in history if "loss" in h]
    ev = [(h["step"], h["eval"]["tau_est"]) for h in history if "eval" in h]
    if not pts:
        return
    W, Hh, L, R, T, B = 720, 360, 60, 60, 30, 40
    x1 = max(p[0] for p in pts)
    lo, hi = min(p[1] for p in pts), max(p[1] for p in pts)
    hi = lo + 1e-9 if hi <= lo else hi
    tmax = max([t for _, t in ev] + [2.0])
    X = lambda s: L + (W - L - R) * s / max(x1, 1)
    Y = lambda v: T + (Hh - T - B) * (1 - (v - lo) / (hi - lo))
    Yt = lambda t: T + (Hh - T - B) * (1 - (t - 1) / (tmax - 1))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{Hh}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{Hh}" fill="white"/>',
           f'<line x1="{L}" y1="{Hh - B}" x2="{W - R}" y2="{Hh - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{Hh - B}" stroke="black"/>',
           f'<text x="{W / 2}" y="{Hh - 8}" text-anchor="middle">optimizer step</text>',
           f'<text x="{L - 6}" y="{Y(hi) + 4}" text-anchor="end">{hi:.2f}</text>',
           f'<text x="{L - 6}" y="{Y(lo) + 4}" text-anchor="end">{lo:.2f}</text>',
           f'<text x="{L}" y="{T - 10}" fill="#1f77b4">{loss_label}</text>',
           f'<text x="{W - R - 6}" y="{Hh - B - 6}" text-anchor="end">{x1}</text>',
           '<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="' +
           " ".join(f"{X(s):.1f},{Y(v):.1f}" for s, v in pts) + '"/>']
    if ev:
        out.append(f'<text x="{W - R + 6}" y="{Yt(tmax) + 4}" fill="#d62728">{tmax:.2f}</text>')
        out.append(f'<text x="{W - R + 6}" y="{Yt(1) + 4}" fill="#d62728">1.00</text>')
        out.append(f'<text x="{W - R}" y="{T - 10}" text-anchor="end" fill="#d62728">{tau_label}</text>')
        out.append('<polyline fill="none" stroke="#d62728" stroke-width="1.5" points="' +
                   " ".join(f"{X(s):.1f},{Yt(t):.1f}" for s, t in ev) + '"/>')
        for s, t in ev:
            out.append(f'<circle cx="{X(s):.1f}" cy="{Yt(t):.1f}" r="3" fill="#d62728"/>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


# ---------------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description="train an EAGLE-3 head on `specactor make-data` output")
    ap.add_argument("--data", required=True, nargs="+", help="the make-data folder(s), of one target")
    ap.add_argument("--out", required=True, help="the head folder to write (config.json + model.safetensors)")
    ap.add_argument("--work", default="", help="checkpoints and the loss log (default: OUT.work)")
    ap.add_argument("--epochs", type=float, default=4)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--ttt-decay", type=float, default=0.8, help="weight of TTT step k is DECAY^k (default 0.8)")
    ap.add_argument("--hard-weight", type=float, default=0.0,
                    help="add W x the cross-entropy against the target's argmax to the soft objective (default 0)")
    ap.add_argument("--intermediate-size", type=int, default=0,
                    help="the head's MLP width (default 0: --init-from's, else the target's intermediate_size)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=float, default=0.03, help="share of the steps spent warming up")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--batch-tokens", type=int, default=1024,
                    help="tokens per optimizer step (small batches: more updates for the same compute)")
    ap.add_argument("--max-len", type=int, default=384, help="longer samples are cut to this many tokens")
    ap.add_argument("--eval-share", type=float, default=0.05,
                    help="share of samples held out, chosen by a hash of each sample (stable when data grows)")
    ap.add_argument("--max-samples", type=int, default=0, help="use only the first N samples (0 = all)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N optimizer steps (0 = the epochs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work")
    ap.add_argument("--init-from", default="",
                    help="start from the weights (and draft vocabulary) of another run's checkpoint.npz or of an "
                         "exported head folder (config.json + model.safetensors, e.g. the shipped one), with a "
                         "fresh optimizer and schedule: fine-tuning on new data (a --resume checkpoint in --work "
                         "wins, so an interrupted run continues); a wider --intermediate-size grows its MLP "
                         "(new units start silent)")
    ap.add_argument("--new-vocab", action="store_true",
                    help="with --init-from: choose the draft vocabulary (--draft-vocab tokens) on this data instead "
                         "of keeping the checkpoint's; output rows of tokens in both carry over, new tokens' rows "
                         "start from the target's output head as in a fresh head")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for XLA (0 = all)")
    ap.add_argument("--log-every", type=int, default=20, help="steps per loss-log entry (default 20)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    a = ap.parse_args()
    for name, ok in [("--epochs", a.epochs > 0), ("--draft-vocab", a.draft_vocab >= 2), ("--ttt-steps", a.ttt_steps >= 1),
                     ("--ttt-decay", 0 < a.ttt_decay <= 1), ("--hard-weight", 0 <= a.hard_weight <= 100),
                     ("--intermediate-size", a.intermediate_size >= 0),
                     ("--lr", a.lr > 0), ("--batch-tokens", a.batch_tokens >= 64), ("--max-len", a.max_len >= 8),
                     ("--eval-share", 0 <= a.eval_share < 1), ("--warmup", 0 <= a.warmup < 1), ("--log-every", a.log_every >= 1)]:
        if not ok:
            fail(f"{name}: out of range")
    if a.threads:
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + \
            f" --xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={a.threads}"
    work = a.work or (a.out.rstrip("/") + ".work")
    try:
        ds = Dataset(a.data, a.max_samples)
    except DataError as e:
        fail(str(e))

    import jax
    import jax.numpy as jnp
    import optax
    from tqdm import tqdm

    ckpt = os.path.join(work, "checkpoint.npz")
    resuming = a.resume and os.path.exists(ckpt)
    init = a.init_from if a.init_from and not resuming else ""
    if init and not os.path.exists(init):
        fail(f"--init-from {init}: not found (a checkpoint.npz from another run's --work folder, or a head folder)")
    if a.new_vocab and not a.init_from:
        fail("--new-vocab: needs --init-from (a fresh run always chooses its vocabulary on the data)")
    src_ckpt = ckpt if resuming else init
    init_head = None  # --init-from a head folder: (params, draft ids)
    if init and (os.path.isdir(init) or init.endswith(".safetensors")):
        try:
            init_head = read_head_folder(init, ds)
        except DataError as e:
            fail(f"--init-from: {e}")
    old_ids = None  # --new-vocab: the checkpoint's draft vocabulary, remapped below
    try:
        if init_head is not None:
            fixed = init_head[1]
        else:
            fixed = np.load(src_ckpt, allow_pickle=False)["draft_ids"] if src_ckpt else None
        if init and a.new_vocab:
            old_ids, fixed = np.asarray(fixed, dtype=np.int64), None
        ids, d2t, t2d, covered = select_vocab(ds, a.draft_vocab, fixed)
    except (DataError, KeyError, ValueError, OSError) as e:
        fail(f"{src_ckpt}: cannot start from it ({e})" + ("; delete it or drop --resume" if resuming else ""))
    m = ds.model
    init_F = None  # the MLP width of --init-from's weights
    if init_head is not None:
        init_F = init_head[0]["gate"].shape[1]
    elif init:
        try:
            with np.load(init, allow_pickle=False) as z:
                init_F = z[f"l{PARAM_NAMES.index('gate')}"].shape[1]
        except (KeyError, ValueError, OSError, IndexError) as e:
            fail(f"{init}: cannot start from it ({e})")
    cfg = {"H": m["hidden_size"], "F": a.intermediate_size or init_F or m["intermediate_size"],
           "nh": m["num_attention_heads"],
           "nkv": m["num_key_value_heads"], "hd": m["head_dim"], "eps": m["rms_norm_eps"],
           "rope_theta": m["rope_theta"], "Vd": len(ids)}
    cfg["QD"], cfg["KD"] = cfg["nh"] * cfg["hd"], cfg["nkv"] * cfg["hd"]
    n = len(ds)
    eval_idx, train_idx = held_out_split(ds, a.eval_share, a.seed)
    buckets = [b for b in (64, 128, 192, 256, 320, 384, 512, 768, 1024) if b < a.max_len] + [a.max_len]
    n_batches = len(batches(ds, train_idx, a.batch_tokens, np.random.default_rng(0), buckets))
    total_steps = max(1, int(math.ceil(n_batches * a.epochs)))
    if a.max_steps:
        total_steps = min(total_steps, a.max_steps)
    tot_tokens = int(ds.offsets[-1])
    print(f"train_eagle3: {n} samples ({len(train_idx)} train, {len(eval_idx)} held out), {tot_tokens} tokens; "
          f"draft vocabulary {len(ids)} covers {100 * covered:.1f}% of trained next tokens; "
          f"{total_steps} steps of ~{a.batch_tokens} tokens; TTT steps {a.ttt_steps}", flush=True)

    warm = max(1, int(total_steps * a.warmup))  # a 1-step run: optax needs decay steps beyond the warmup
    sched = optax.warmup_cosine_decay_schedule(0.0, a.lr, warm, max(total_steps, warm + 1),
                                               end_value=a.lr * 0.05)
    tx = optax.chain(optax.clip_by_global_norm(a.clip), optax.adamw(sched, weight_decay=a.weight_decay))
    embed = jnp.asarray(ds.embed)
    tgt_head = jnp.asarray(ds.lm_head[ids].T)  # [H, Vd]
    tgt_norm = jnp.asarray(ds.output_norm)
    in_vocab = jnp.asarray(t2d.astype(np.float32))
    params = init_params(jax.random.PRNGKey(a.seed), cfg, ds.lm_head[ids].T.copy(), ds.output_norm.copy())
    opt_state = tx.init(params)
    step, epoch_start, history = 0, 0, []
    os.makedirs(work, exist_ok=True)
    if src_ckpt:
        try:
            z = np.load(src_ckpt, allow_pickle=False) if init_head is None else None
            state = (params, opt_state) if resuming else params  # --init-from: the weights only
            leaves, treedef = jax.tree_util.tree_flatten(state)
            if init_head is not None:  # a dict flattens in key order
                loaded = [init_head[0][k] for k in PARAM_NAMES]
            else:
                loaded = [z[f"l{i}"] for i in range(len(leaves))]  # params' leaves come first in either
            if init:  # a wider MLP than the source's
                grown = grow_mlp(dict(zip(PARAM_NAMES, loaded)), cfg["F"], a.seed)
                if grown["gate"].shape[1] != loaded[PARAM_NAMES.index("gate")].shape[1]:
                    print(f"train_eagle3: MLP grown from {loaded[PARAM_NAMES.index('gate')].shape[1]} to "
                          f"{cfg['F']} units (the new ones start silent)", flush=True)
                loaded = [grown[k] for k in PARAM_NAMES]
            if old_ids is not None:  # --new-vocab: the output head's columns follow their tokens
                lm_at = PARAM_NAMES.index("lm_head")
                old_lm = loaded[lm_at]
                if old_lm.shape != (cfg["H"], len(old_ids)):
                    raise DataError(f"its output head has shape {old_lm.shape}, expected ({cfg['H']}, "
                                    f"{len(old_ids)}) (another target?)")
                new_lm = np.asarray(params["lm_head"]).copy()
                pos = {int(t): j for j, t in enumerate(old_ids)}
                kept = [(i, pos[int(t)]) for i, t in enumerate(ids) if int(t) in pos]
                if kept:
                    new_lm[:, [i for i, _ in kept]] = old_lm[:, [j for _, j in kept]]
                loaded[lm_at] = new_lm
                print(f"train_eagle3: new draft vocabulary; {len(kept)} of its {len(ids)} tokens carry their "
                      f"trained output rows over from the checkpoint's {len(old_ids)}", flush=True)
            for i, (x, y) in enumerate(zip(leaves, loaded)):
                if np.shape(x) != y.shape:
                    raise DataError(f"leaf {i} has shape {y.shape}, expected {np.shape(x)} (other settings?)")
            state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(v) for v in loaded])
            if resuming:
                params, opt_state = state
                step = int(z["step"])
                history = json.loads(str(z["history"]))
                print(f"train_eagle3: resumed from {ckpt} at step {step}", flush=True)
            else:
                params = state
                print(f"train_eagle3: weights from {init}" + (f" (step {int(z['step'])} there)" if z is not None else "")
                      + "; a fresh optimizer", flush=True)
        except (DataError, KeyError, ValueError, OSError) as e:
            fail(f"{src_ckpt}: cannot start from it ({e})" + ("; delete it or drop --resume" if resuming else ""))
    elif a.resume:
        print(f"train_eagle3: no checkpoint in {work}; starting fresh", flush=True)

    def save():
        leaves, _ = jax.tree_util.tree_flatten((params, opt_state))
        tmp = ckpt + ".tmp.npz"
        np.savez(tmp, step=step, draft_ids=ids, history=json.dumps(history),
                 **{f"l{i}": np.asarray(x) for i, x in enumerate(leaves)})
        os.replace(tmp, ckpt)

    train_step, eval_step = build_step_fns(cfg, a.ttt_steps, tx, a.ttt_decay, a.hard_weight)
    stop = {"now": False}
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, or `kill` of a run started in the background
        signal.signal(sig, lambda *_: stop.update(now=True))

    def evaluate():
        if not eval_idx:
            return None
        hits = np.zeros(a.ttt_steps); cnt = np.zeros(a.ttt_steps); ce = np.zeros(a.ttt_steps)
        chain_sum, chain_n = 0.0, 0.0
        for bi, T in batches(ds, eval_idx, a.batch_tokens, np.random.default_rng(0), buckets):
            tok, lm, am, aux, last, valid = make_batch(ds, bi, T)
            _, stats = eval_step(params, embed, tgt_head, tgt_norm, (tok, lm, am, aux, last, valid, in_vocab))
            for k, (h, c, e, _) in enumerate(stats):
                hits[k] += float(h); cnt[k] += float(c); ce[k] += float(e)
            chain, n = chain_accepted(tok, lm, am, valid, [np.asarray(st[3]) for st in stats], ids)
            chain_sum += chain; chain_n += n
        acc = hits / np.maximum(cnt, 1)
        # tokens per verification of a greedy chain of --ttt-steps drafts: 1 + consecutive accepted drafts
        tau = 1 + chain_sum / max(chain_n, 1)
        return {"acc": acc.round(4).tolist(), "ce": (ce / np.maximum(cnt, 1)).round(4).tolist(), "tau_est": round(tau, 3)}

    t0 = time.time()
    epoch = step // max(1, n_batches)
    bar = tqdm(total=total_steps, initial=step, disable=a.quiet, unit="step", dynamic_ncols=True,
               mininterval=0.1 if sys.stderr.isatty() else 30)  # a log file gets a line every 30 s
    run_loss, run_n = 0.0, 0
    while step < total_steps and not stop["now"]:
        erng = np.random.default_rng(a.seed * 1000 + epoch)
        plan = batches(ds, train_idx, a.batch_tokens, erng, buckets)
        skip = step - epoch * n_batches
        for bi, T in plan[max(0, skip):]:
            if step >= total_steps or stop["now"]:
                break
            tok, lm, am, aux, last, valid = make_batch(ds, bi, T)
            params, opt_state, loss, _ = train_step(params, opt_state, embed, tgt_head, tgt_norm,
                                                    (tok, lm, am, aux, last, valid, in_vocab))
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
                tqdm.write(f"epoch {epoch}: held-out acceptance by depth {ev['acc']}, τ estimate {ev['tau_est']}")
            save()
    bar.close()
    save()
    with open(os.path.join(work, "history.json"), "w") as f:
        json.dump(history, f, indent=1)
    write_chart(history, os.path.join(work, "loss.svg"))
    if stop["now"]:
        print(f"train_eagle3: interrupted at step {step}; rerun with --resume to continue", flush=True)
        sys.exit(130)
    try:
        export(params, cfg, ds, d2t, t2d, a.out)
    except DataError as e:
        fail(str(e))
    last = next((h["eval"] for h in reversed(history) if "eval" in h), None)
    print(f"train_eagle3: wrote {a.out} after {step} steps in {time.time() - t0:.0f} s"
          + (f"; held-out τ estimate {last['tau_est']}, acceptance by depth {last['acc']}" if last else ""), flush=True)


if __name__ == "__main__":
    main()
