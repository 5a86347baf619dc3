#!/usr/bin/env python3
"""tools/reference.py — independent references for specactor's tests.

  logits     float64 forward of a GGUF Llama model (numpy; weights dequantized by the `gguf`
             package): top-5 logits of the last prompt position and a 32-token greedy continuation
             for each golden prompt  ->  tests/data/model_goldens.json
  tokenizer  token ids of >= 200 varied strings from Hugging Face `tokenizers`, built from the same
             vocabulary and merges as the GGUF  ->  tests/data/tokenizer_goldens.json
  quant      random blocks of every weight format dequantized by `gguf`  ->  tests/data/quant_goldens.json

Run through tools/make_goldens (it creates .venv with pinned numpy, gguf, tokenizers).
"""
import argparse
import json
import random
import sys
import time

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType, quants

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"

# Prompts as text; ids come from the Hugging Face tokenizer (no BOS: the test feeds these ids).
GOLDEN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis is the process by which",
    "1, 2, 3, 4, 5,",
]


def field(r, key):
    return r.fields[key].contents()


class Reference:
    """Llama forward in float64 with an explicit KV cache."""

    def __init__(self, path):
        r = GGUFReader(path)
        arch = field(r, "general.architecture")
        assert arch == "llama", arch
        g = lambda k: field(r, f"{arch}.{k}")
        self.n_layers = int(g("block_count"))
        self.hidden = int(g("embedding_length"))
        self.n_heads = int(g("attention.head_count"))
        self.n_kv = int(g("attention.head_count_kv"))
        self.head_dim = self.hidden // self.n_heads
        self.rope_dim = int(g("rope.dimension_count")) if f"{arch}.rope.dimension_count" in r.fields else self.head_dim
        self.eps = float(g("attention.layer_norm_rms_epsilon"))
        self.base = float(g("rope.freq_base"))
        self.w = {}
        for t in r.tensors:
            a = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml dims reversed = numpy (rows, cols)
            self.w[t.name] = a.reshape(shape)
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])
        self.reset()

    def reset(self):
        self.k = [[] for _ in range(self.n_layers)]
        self.v = [[] for _ in range(self.n_layers)]
        self.pos = 0

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, positions):  # x: (T, heads, head_dim); GGUF llama: adjacent pairs
        half = self.rope_dim // 2
        inv = self.base ** (-2.0 * np.arange(half) / self.rope_dim)
        ang = np.outer(positions, inv)  # (T, half)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x = x.copy()
        x0, x1 = x[..., 0:self.rope_dim:2].copy(), x[..., 1:self.rope_dim:2].copy()
        x[..., 0:self.rope_dim:2] = x0 * c - x1 * s
        x[..., 1:self.rope_dim:2] = x0 * s + x1 * c
        return x

    def forward(self, tokens):
        """Appends tokens; returns logits (T, vocab)."""
        T = len(tokens)
        positions = np.arange(self.pos, self.pos + T)
        x = self.w["token_embd.weight"][tokens]
        group = self.n_heads // self.n_kv
        for l in range(self.n_layers):
            p = f"blk.{l}."
            h = self.rmsnorm(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, self.n_heads, self.head_dim)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, self.n_kv, self.head_dim)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, self.n_kv, self.head_dim)
            q, k = self.rope(q, positions), self.rope(k, positions)
            self.k[l].append(k)
            self.v[l].append(v)
            K, V = np.concatenate(self.k[l]), np.concatenate(self.v[l])  # (S, n_kv, hd)
            S = K.shape[0]
            att = np.empty((T, self.n_heads, self.head_dim))
            for hh in range(self.n_heads):
                sc = q[:, hh, :] @ K[:, hh // group, :].T / np.sqrt(self.head_dim)  # (T, S)
                mask = np.arange(S)[None, :] > (positions[:, None])
                sc[mask] = -np.inf
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                sc /= sc.sum(axis=1, keepdims=True)
                att[:, hh, :] = sc @ V[:, hh // group, :]
            x = x + att.reshape(T, -1) @ self.w[p + "attn_output.weight"].T
            h = self.rmsnorm(x, self.w[p + "ffn_norm.weight"])
            gte = h @ self.w[p + "ffn_gate.weight"].T
            up = h @ self.w[p + "ffn_up.weight"].T
            x = x + (gte / (1.0 + np.exp(-gte)) * up) @ self.w[p + "ffn_down.weight"].T
        self.pos += T
        return self.rmsnorm(x, self.w["output_norm.weight"]) @ self.out.T


def hf_tokenizer(path):
    """A Hugging Face tokenizer from the GGUF's vocabulary, merges and special tokens, configured as
    SmolLM2's published tokenizer.json (Digits(individual) + ByteLevel pre-tokenizer)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = GGUFReader(path)
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in range(len(tokens)) if types[i] == 3])
    return tk


def tokenizer_strings():
    fixed = [
        "", " ", "  ", "\n", "\n\n", "\t", " \t \n ", "Hello", "Hello world", " Hello world", "Hello  world",
        "Hello   world   ", "hello, world!", "HELLO WORLD", "It's a dog's life, isn't it? We'll see; they'd've known.",
        "I'M SHOUTING", "don't DON'T Don't", "The quick brown fox jumps over the lazy dog.",
        "1234567890", "3.14159", "-42", "+1 (555) 123-4567", "2024-11-29T17:00:00Z", "1,000,000", "0x1F", "1e-5",
        "version 2.0.1", "a1b2c3", "$100.00", "50%", "#1", "@user", "user@example.com", "https://example.com/a?b=c&d=e",
        "C:\\Program Files\\x", "/usr/local/bin", "~/.bashrc", "\"quoted\"", "'single'", "`code`", "(parens)", "[brackets]",
        "{braces}", "<angle>", "a+b=c", "x*y/z", "a||b&&c", "!!!", "???", "...", "--", "---", "***", "___", "==", "!=",
        "->", "=>", "::", ";;", "def f(x):\n    return x + 1\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        "#include <stdio.h>\nint main(void) { return 0; }", "SELECT * FROM users WHERE id = 1;",
        "<html><body><p>Hi</p></body></html>", "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
        "    indented\n        more", "trailing spaces   ", "   leading spaces", "tabs\tand\tspaces",
        "line1\r\nline2\r\n", "mixed \n\t whitespace \n\n\n end",
        "café", "naïve résumé", "Ångström", "Straße", "façade", "über", "señor niño", "crème brûlée", "Ελληνικά",
        "Привет, мир!", "Здравствуйте", "שלום", "مرحبا بالعالم", "नमस्ते", "สวัสดี", "こんにちは世界", "東京都",
        "你好，世界！", "中文分词测试", "한국어 텍스트", "漢字とカタカナとひらがな", "Hello 世界 123",
        "😀", "👍🏽", "🇫🇷", "👨‍👩‍👧‍👦", "I ❤️ NY", "🚀 to the 🌙!", "emoji😀inside", "✓ ✗ → ← ↑ ↓", "∑ ∫ √ ∞ ≈ ≠",
        "α β γ δ", "½ ¼ ¾", "©®™", "€£¥₹", "°C", "µs", "—en–dash—", "“curly” ‘quotes’", "…", "•bullet",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "plain <|im_start|> inside", "<repo_name>", "<file_sep>",
        "\u00a0nbsp", "zero\u200bwidth", "a\u0301", "e\u0308", "\u2028", "ﬁ ligature", "ｆｕｌｌｗｉｄｔｈ",
    ]
    rng = random.Random(20261129)
    pools = {
        "ascii": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "digits": "0123456789",
        "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "space": "  \t\n",
        "accent": "éèêëàâäîïôöùûüçñåøæœß",
        "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长",
        "emoji": "😀😂🥲😍🤖👍🔥✨🎉🌍🍕⚡",
    }
    words = ["the", "of", "and", "to", "in", "is", "speculative", "decoding", "actor", "token", "model", "cache",
             "GPU", "CPU", "don't", "it's", "we'll", "x", "y", "z"]
    gen = []
    while len(gen) < 140:
        parts = []
        for _ in range(rng.randint(1, 8)):
            kind = rng.choice(list(pools) + ["word", "word", "word"])
            if kind == "word":
                w = rng.choice(words)
                parts.append(w.capitalize() if rng.random() < 0.2 else w)
            else:
                parts.append("".join(rng.choice(pools[kind]) for _ in range(rng.randint(1, 6))))
        sep = rng.choice([" ", "", "  ", "\n", ", ", " - "])
        gen.append(sep.join(parts))
    return fixed + gen


def cmd_tokenizer(args):
    tk = hf_tokenizer(args.model)
    cases = []
    for s in tokenizer_strings():
        ids = tk.encode(s, add_special_tokens=False).ids
        cases.append({"text": s, "ids": ids})
    out = {"source": "Hugging Face tokenizers %s from the GGUF vocabulary/merges of %s; pre-tokenizer "
                     "Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)]; special tokens "
                     "parsed" % (__import__("tokenizers").__version__, args.model.split("/")[-1]),
           "cases": cases}
    write_json(args.out or "tests/data/tokenizer_goldens.json", out)
    print(f"{len(cases)} tokenizer cases", file=sys.stderr)


def cmd_logits(args):
    tk = hf_tokenizer(args.model)
    t0 = time.time()
    ref = Reference(args.model)
    print(f"loaded and dequantized in {time.time() - t0:.1f} s", file=sys.stderr)
    cases = []
    for text in GOLDEN_PROMPTS:
        ids = tk.encode(text, add_special_tokens=False).ids
        ref.reset()
        logits = ref.forward(np.array(ids))[-1]
        top = np.argsort(-logits)[:5]
        cont = []
        nxt = int(np.argmax(logits))
        margins = []
        for _ in range(args.steps):
            cont.append(nxt)
            lg = ref.forward(np.array([nxt]))[-1]
            srt = np.sort(lg)
            margins.append(float(srt[-1] - srt[-2]))
            nxt = int(np.argmax(lg))
        cases.append({"text": text, "ids": ids, "top5_ids": [int(i) for i in top],
                      "top5_logits": [float(logits[i]) for i in top], "greedy": cont,
                      "min_greedy_margin": min(margins)})
        print(f"{text!r}: top {int(top[0])} ({logits[top[0]]:.4f}), min margin {min(margins):.4f}", file=sys.stderr)
    out = {"source": "tools/reference.py logits: float64 numpy forward, weights dequantized by gguf %s" % (
        __import__("gguf").__version__ if hasattr(__import__("gguf"), "__version__") else ""),
           "model": args.model.split("/")[-1], "steps": args.steps, "cases": cases}
    write_json(args.out or "tests/data/model_goldens.json", out)


def cmd_quant(args):
    rng = np.random.default_rng(7)
    out = {"source": "random blocks dequantized by gguf.quants.dequantize", "cases": []}
    for name, qt, blocks in [("Q8_0", GGMLQuantizationType.Q8_0, 3), ("Q4_0", GGMLQuantizationType.Q4_0, 3),
                             ("Q4_1", GGMLQuantizationType.Q4_1, 3), ("Q4_K", GGMLQuantizationType.Q4_K, 2),
                             ("Q6_K", GGMLQuantizationType.Q6_K, 2), ("F16", GGMLQuantizationType.F16, 64),
                             ("BF16", GGMLQuantizationType.BF16, 64)]:
        bs, ts = quants.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, size=blocks * ts, dtype=np.uint8)
        # Keep every f16/bf16 field finite and modest: overwrite scale fields with sane values.
        if name in ("F16", "BF16"):
            vals = rng.normal(0, 1, size=blocks).astype(np.float32)
            raw = (vals.astype(np.float16).view(np.uint8) if name == "F16"
                   else (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8))
        else:
            for b in range(blocks):
                off = b * ts
                positions = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q6_K": [208]}[name]
                for p in positions:
                    raw[off + p: off + p + 2] = np.array([rng.uniform(0.001, 0.05)], dtype=np.float16).view(np.uint8)
        vals = quants.dequantize(raw.reshape(1, -1), qt).reshape(-1)
        out["cases"].append({"type": name, "bytes": raw.tolist(), "values": [float(v) for v in vals]})
    write_json(args.out or "tests/data/quant_goldens.json", out)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["logits", "tokenizer", "quant"])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out")
    args = ap.parse_args()
    {"logits": cmd_logits, "tokenizer": cmd_tokenizer, "quant": cmd_quant}[args.what](args)


if __name__ == "__main__":
    main()
