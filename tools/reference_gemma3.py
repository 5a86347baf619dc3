#!/usr/bin/env python3
"""tools/reference_gemma3.py — a float64 forward of a Gemma 3 GGUF (weights dequantized by `gguf`), as
the judge between specactor and llama.cpp where their greedy tokens differ.

For each prompt (tools/compare_continuations.py's 24 by default, ids from specactor's /tokenize, which
equal llama.cpp's): the float64 greedy continuation of N tokens, then, teacher-forced along it, how often
each engine's greedy next token is the float64 one — specactor through `specactor serve`
(/generate, one token) in the precision given, llama.cpp through llama-server (/completion, top_k 1).
Prints one JSON object. Needs numpy and gguf (.venv-families has both) and the llama-server binary.

    .venv-families/bin/python tools/reference_gemma3.py --llama-bin DIR --model models/gemma-3-270m-q4_k_m.gguf
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
from gguf import GGUFReader, quants

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_continuations as cc  # noqa: E402  (servers, ports, prompts)


class Gemma3:
    """Gemma 3 in float64 with an explicit KV cache (GGUF names; norms hold 1 + w already)."""

    def __init__(self, path):
        r = GGUFReader(path)
        f = lambda k: r.fields[k].contents()
        a = "gemma3."
        self.n_layers = int(f(a + "block_count"))
        self.hidden = int(f(a + "embedding_length"))
        self.n_heads = int(f(a + "attention.head_count"))
        self.n_kv = int(f(a + "attention.head_count_kv"))
        self.head_dim = int(f(a + "attention.key_length"))
        self.eps = float(f(a + "attention.layer_norm_rms_epsilon"))
        self.base = float(f(a + "rope.freq_base"))
        self.window = int(f(a + "attention.sliding_window"))
        self.local_base = 10000.0
        self.sliding = [(l + 1) % 6 != 0 for l in range(self.n_layers)]
        self.w = {}
        for t in r.tensors:
            arr = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = arr.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))
        self.reset()

    def reset(self):
        self.k = [np.zeros((0, self.n_kv, self.head_dim)) for _ in range(self.n_layers)]
        self.v = [np.zeros((0, self.n_kv, self.head_dim)) for _ in range(self.n_layers)]
        self.pos = 0

    def norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base):  # half-split pairs
        half = self.head_dim // 2
        ang = np.outer(pos, base ** (-2.0 * np.arange(half) / self.head_dim))
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def forward(self, tokens):
        T = len(tokens)
        pos = np.arange(self.pos, self.pos + T)
        x = self.w["token_embd.weight"][tokens] * np.sqrt(self.hidden)
        g = self.n_heads // self.n_kv
        for l in range(self.n_layers):
            p = f"blk.{l}."
            h = self.norm(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, self.n_heads, self.head_dim)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, self.n_kv, self.head_dim)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, self.n_kv, self.head_dim)
            q = self.norm(q, self.w[p + "attn_q_norm.weight"])
            k = self.norm(k, self.w[p + "attn_k_norm.weight"])
            base = self.local_base if self.sliding[l] else self.base
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            self.k[l] = np.concatenate([self.k[l], k])
            self.v[l] = np.concatenate([self.v[l], v])
            K, V = self.k[l], self.v[l]
            kpos = np.arange(K.shape[0])
            att = np.empty((T, self.n_heads, self.head_dim))
            for hh in range(self.n_heads):
                sc = q[:, hh, :] @ K[:, hh // g, :].T / np.sqrt(self.head_dim)
                masked = kpos[None, :] > pos[:, None]
                if self.sliding[l]:
                    masked |= pos[:, None] - kpos[None, :] >= self.window
                sc[masked] = -np.inf
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                att[:, hh, :] = (sc / sc.sum(axis=1, keepdims=True)) @ V[:, hh // g, :]
            o = att.reshape(T, -1) @ self.w[p + "attn_output.weight"].T
            x = x + self.norm(o, self.w[p + "post_attention_norm.weight"])
            h = self.norm(x, self.w[p + "ffn_norm.weight"])
            gt = h @ self.w[p + "ffn_gate.weight"].T
            up = h @ self.w[p + "ffn_up.weight"].T
            gelu = 0.5 * gt * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gt + 0.044715 * gt ** 3)))
            x = x + self.norm((gelu * up) @ self.w[p + "ffn_down.weight"].T, self.w[p + "post_ffw_norm.weight"])
        self.pos += T
        return self.norm(x[-1:], self.w["output_norm.weight"]) @ self.w["token_embd.weight"].T


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--specactor", default="build/specactor")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    ref = Gemma3(args.model)
    lp, fp, ep = cc.free_port(), cc.free_port(), cc.free_port()
    procs = [subprocess.Popen([os.path.join(args.llama_bin, "llama-server"), "-m", args.model, "-t", str(args.threads),
                               "-c", "4096", "--port", str(lp), "--host", "127.0.0.1", "-np", "1", "--no-webui"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    for port, precision in ((fp, "fast"), (ep, "exact")):
        procs.append(subprocess.Popen([args.specactor, "serve", "--model-path", args.model, "--port", str(port),
                                       "--threads", str(args.threads), "--speculative-algorithm", "NONE",
                                       "--cpu-precision", precision], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    try:
        cc.wait_ready(lp, procs[0], "llama-server")
        cc.wait_ready(fp, procs[1], "specactor serve (fast)")
        cc.wait_ready(ep, procs[2], "specactor serve (exact)")
        hits = {"llama.cpp": 0, "specactor fast": 0, "specactor exact": 0}
        total = 0
        margins = []
        for text in cc.PROMPTS:
            ids = cc.post(fp, "/tokenize", {"prompt": text})["tokens"]
            ref.reset()
            logits = ref.forward(ids)[0]
            cont = []
            for _ in range(args.tokens):
                top2 = np.argsort(logits)[-2:]
                margins.append(float(logits[top2[1]] - logits[top2[0]]))
                cont.append(int(top2[1]))
                logits = ref.forward([cont[-1]])[0]
            for i in range(len(cont)):
                prefix = ids + cont[:i]
                hits["llama.cpp"] += cc.llama_continue(lp, prefix, 1)[0] == cont[i]
                hits["specactor fast"] += cc.spec_continue(fp, prefix, 1)[0] == cont[i]
                hits["specactor exact"] += cc.spec_continue(ep, prefix, 1)[0] == cont[i]
            total += len(cont)
            print(f"  {text[:40]!r}: {({k: v for k, v in hits.items()})} of {total}", file=sys.stderr)
        print(json.dumps({"model": os.path.basename(args.model), "prompts": len(cc.PROMPTS), "positions": total,
                          "top1_agreement_with_float64": {k: v / total for k, v in hits.items()},
                          "float64_top2_margin_median": float(np.median(margins))}, indent=1))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
