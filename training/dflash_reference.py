#!/usr/bin/env python3
"""An independent float64 numpy forward of a DFlash or DSpark drafter (the C++ one is
model/block_drafter.cpp), for tests/test_block_drafter.cpp. Written from the architecture's description,
not from the C++ code.

    python training/dflash_reference.py CASE_DIR

CASE_DIR holds case.json {"drafter": FOLDER, "tokens": [...], "contexts": [n1, n2, ...]},
target.safetensors {"embed": [V, H], "output": [V, H]} (the target's embedding and output head) and
features.safetensors {"features": [rows, K*H]} (the target's hidden rows of positions 0, 1, ...). For
each n in contexts the drafter sees tokens[:n] (features of positions 0..n-2, the root tokens[n-1]) and
the script writes, to CASE_DIR/reference.json, the drafts (argmax of the block's rows 1..B-1, as target
ids), their logits (over the drafter's draft vocabulary when it has one) and each row's margin between
its best and second-best logit. A DSpark drafter (architectures ["DSparkDraftModel"]) goes on row by
row: row i's logits get the Markov term W2 @ W1[prev] (prev: the root for row 1, draft i-1 after), its
confidence is sigmoid(w . [normed hidden row i ; W1[prev]] + b); the script then also writes the
backbone's logits ("base_logits") and the confidences.
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def rotate(x, positions, theta):
    """RoPE on rotate-half pairs (i, i + d/2) of each head; x: [n, heads, d]."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


class Drafter:
    def __init__(self, folder):
        cfg = json.load(open(os.path.join(folder, "config.json")))
        self.dspark = "DSparkDraftModel" in cfg.get("architectures", [])
        groups = [cfg.get("dspark_config", {}), cfg.get("dflash_config", {}), cfg]

        def get(k, d=None):
            return next((g[k] for g in groups if k in g), d)
        self.H = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.d = cfg.get("head_dim", self.H // self.heads)
        self.layers = cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
        self.block = get("block_size", 16)
        self.mask = get("mask_token_id")
        self.embed_scale = get("input_embedding_scale", 1.0)
        self.mult = get("output_multiplier", 1.0)
        self.cap = get("final_logit_softcapping", 0.0) or 0.0
        self.markov_first_row = get("markov_first_row", True)
        tensors = load_file(os.path.join(folder, "model.safetensors"))
        # specactor's optional draft vocabulary: the logits cover these target ids' output rows only
        self.vocab = tensors.pop("draft_vocab", None)
        self.w = {k: v.astype(np.float64) for k, v in tensors.items()}

    def kv(self, i, x, positions):
        w, p = self.w, f"layers.{i}.self_attn."
        n = x.shape[0]
        k = rms_norm((x @ w[p + "k_proj.weight"].T).reshape(n, self.kv_heads, self.d), w[p + "k_norm.weight"], self.eps)
        v = (x @ w[p + "v_proj.weight"].T).reshape(n, self.kv_heads, self.d)
        return rotate(k, positions, self.theta), v

    def forward(self, embed, output, features, tokens, rows=None):
        """Logits [rows-1, V] of the block after `tokens` given the features of tokens[:-1]; rows
        defaults to the block size (the engine runs one row per draft it is asked for)."""
        w, n, rows = self.w, len(tokens), rows or self.block
        ctx = rms_norm(features[: n - 1] @ w["fc.weight"].T, w["hidden_norm.weight"], self.eps)
        ctx_pos = np.arange(n - 1)
        block = [tokens[-1]] + [self.mask] * (rows - 1)
        pos = np.arange(n - 1, n - 1 + rows)
        x = embed[block] * self.embed_scale
        group = self.heads // self.kv_heads
        for i in range(self.layers):
            p = f"layers.{i}."
            y = rms_norm(x, w[p + "input_layernorm.weight"], self.eps)
            q = rms_norm((y @ w[p + "self_attn.q_proj.weight"].T).reshape(rows, self.heads, self.d),
                         w[p + "self_attn.q_norm.weight"], self.eps)
            q = rotate(q, pos, self.theta)
            kc, vc = self.kv(i, ctx, ctx_pos)
            kb, vb = self.kv(i, y, pos)
            k, v = np.concatenate([kc, kb]), np.concatenate([vc, vb])
            att = np.zeros((rows, self.heads, self.d))
            for h in range(self.heads):
                scores = q[:, h, :] @ k[:, h // group, :].T / np.sqrt(self.d)  # every key: no causal mask
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                att[:, h, :] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, h // group, :]
            x = x + att.reshape(rows, -1) @ w[p + "self_attn.o_proj.weight"].T
            y = rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            x = x + (silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)) @ \
                w[p + "mlp.down_proj.weight"].T
        head = output if self.vocab is None else output[self.vocab]
        self.hidden = rms_norm(x[1:], w["norm.weight"], self.eps)
        logits = self.hidden @ head.T * self.mult
        if self.cap > 0:
            logits = np.tanh(logits / self.cap) * self.cap
        return logits

    def to_target(self, i):
        return int(i if self.vocab is None else self.vocab[i])

    def sequential(self, base, root):
        """DSpark: each row's logits plus the Markov term of the token before it (not the first row's
        with markov_first_row false); the confidences."""
        w, logits, conf, prev = self.w, base.copy(), [], root
        for i in range(base.shape[0]):
            e = w["markov_head.w1.weight"][prev]
            if i > 0 or self.markov_first_row:
                logits[i] += w["markov_head.w2.weight"] @ e
            z = w["confidence_head.weight"][0] @ np.concatenate([self.hidden[i], e]) + w["confidence_head.bias"][0]
            conf.append(float(1.0 / (1.0 + np.exp(-z))))
            prev = self.to_target(logits[i].argmax())
        return logits, conf


def main():
    case = sys.argv[1]
    spec = json.load(open(os.path.join(case, "case.json")))
    target = {k: v.astype(np.float64) for k, v in load_file(os.path.join(case, "target.safetensors")).items()}
    features = load_file(os.path.join(case, "features.safetensors"))["features"].astype(np.float64)
    drafter = Drafter(spec["drafter"])
    out = []
    # Each context with the whole block, then (short_rows) the last one with a shorter block.
    runs = [(n, None) for n in spec["contexts"]]
    if spec.get("short_rows"):
        runs.append((spec["contexts"][-1], spec["short_rows"]))
    for n, rows in runs:
        logits = drafter.forward(target["embed"], target["output"], features, spec["tokens"][:n], rows)
        entry = {"n": n, "rows": rows or drafter.block}
        if drafter.dspark:
            entry["base_logits"] = logits.tolist()
            logits, entry["confidences"] = drafter.sequential(logits, spec["tokens"][n - 1])
        top2 = np.sort(logits, axis=-1)[:, -2:]
        entry.update({"tokens": [drafter.to_target(i) for i in logits.argmax(axis=-1)],
                      "margins": [float(m) for m in top2[:, 1] - top2[:, 0]], "logits": logits.tolist()})
        out.append(entry)
        print(f"context {n}: drafts {out[-1]['tokens']}")
    json.dump({"contexts": out}, open(os.path.join(case, "reference.json"), "w"))


if __name__ == "__main__":
    main()
