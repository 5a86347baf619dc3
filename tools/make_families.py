#!/usr/bin/env python3
"""tools/make_families.py — tiny random models of the qwen2, qwen3 and gemma3 families and their references.

For each family: a model made by `transformers` in the family's real layout (random weights, seeded,
float16 values) saved as safetensors + config.json, the same weights written as a GGUF with the `gguf` package
(llama.cpp's tensor names and metadata keys; Gemma's RMSNorm scales stored as 1 + w, as llama.cpp's
converter does), and transformers' float32 forward as the reference:

    tests/data/families/<family>/config.json, model.safetensors     the Hugging Face checkpoint
    tests/data/families/<family>.gguf                                 the same weights (F16 matrices)
    tests/data/families/<family>.json                                 64 token ids, the logits at every
                                                                      position, a 16-token greedy continuation
    tests/data/families/qwen2/tokenizer.json, tokenizer_config.json    a byte-level BPE in Qwen2's layout
                                                                      (trained by `tokenizers` on the frozen
                                                                      training/prompt_passages.txt; also in
                                                                      qwen2.gguf, pre "qwen2")
    tests/data/families/qwen2_tokenizer.json                          `tokenizers`' ids of a hostile corpus
    tests/data/families/{gemma3,llama}/tokenizer.json, ..._config.json a SentencePiece-style BPE (byte fallback)
                                                                      in Gemma's and legacy Llama-2's layouts
    tests/data/families/{gemma3,llama}_tokenizer.json                 `tokenizers`' ids of the same corpus

Run through tools/make_families (it creates .venv-families with the pinned packages). Deterministic:
the same seed gives the same files.
"""
import argparse
import copy
import json
import os
import sys

import numpy as np
import torch
import gguf
import tokenizers
import transformers
from transformers import AutoModelForCausalLM

VOCAB = 384
POSITIONS = 64
CONTINUATION = 16

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)

FAMILIES = {
    # Llama: the baseline the others differ from (its GGUF permutes Q/K rows as llama.cpp's converter does).
    "llama": dict(model_type="llama", num_hidden_layers=3, rope_theta=10000.0, tie_word_embeddings=False),
    # Qwen2: biases on q/k/v; untied head.
    "qwen2": dict(model_type="qwen2", num_hidden_layers=3, rope_theta=10000.0, tie_word_embeddings=False,
                  use_sliding_window=False),
    # Qwen3: q/k head norms, heads wider than hidden / heads (head_dim 32: q is 128 wide), tied head.
    "qwen3": dict(model_type="qwen3", num_hidden_layers=3, head_dim=32, rope_theta=1000000.0,
                  tie_word_embeddings=True, attention_bias=False, use_sliding_window=False),
    # Gemma 3: sandwich norms, (1 + w) scales, GELU-tanh, √hidden embeddings, q/k norms, sliding window
    # of 16 on layers 0, 1, 3, 4 (global: 2 and 5; pattern 3), local RoPE base 10,000, global 1,000,000.
    "gemma3": dict(model_type="gemma3_text", num_hidden_layers=6, head_dim=32, rope_theta=1000000.0,
                   rope_local_base_freq=10000.0, sliding_window=16, query_pre_attn_scalar=32,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                   tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
                   hidden_activation="gelu_pytorch_tanh"),
}


def make_model(family, seed):
    spec = dict(FAMILIES[family])
    model_type = spec.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **COMMON, **spec)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                # Scales near 1 (Gemma stores w for 1 + w: near 0), varied so a wrong formula shows.
                base = 0.0 if family == "gemma3" else 1.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(torch.float16).to(torch.float32))  # float16 values: the files store float16
    model.eval()
    return model


# Hugging Face name (after "model.layers.N.") -> GGUF name (after "blk.N."), per family.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GEMMA_NORMS = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def write_gguf(model, family, path, tok=None):
    cfg = model.config
    arch = "gemma3" if family == "gemma3" else family
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny random {family} (tools/make_families.py)")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim != cfg.hidden_size // cfg.num_attention_heads or family == "gemma3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if family == "gemma3":
        w.add_sliding_window(cfg.sliding_window)
        pattern = cfg.layer_types.index("full_attention") + 1
        assert all((t == "full_attention") == ((i + 1) % pattern == 0) for i, t in enumerate(cfg.layer_types))
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", pattern)
        w.add_float32(f"{arch}.rope.freq_base_swa", cfg.rope_local_base_freq)
    if tok is not None:
        write_gguf_tokenizer(w, tok)
    gemma_norms = family == "gemma3"
    names = dict(LAYER_NAMES)
    if gemma_norms:
        names.update(GEMMA_NORMS)
    else:
        names["post_attention_layernorm.weight"] = "ffn_norm.weight"
    for name, p in model.state_dict().items():
        a = p.detach().to(torch.float32).numpy()
        if name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            out = "output.weight"
        elif name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name.startswith("model.layers."):
            if family == "llama" and (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
                heads = cfg.num_attention_heads if name.endswith("q_proj.weight") else cfg.num_key_value_heads
                a = a.reshape(heads, 2, a.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(a.shape)
            rest = name[len("model.layers."):]
            layer, key = rest.split(".", 1)
            if key not in names:
                raise SystemExit(f"make_families: no GGUF name for {name}")
            out = f"blk.{layer}.{names[key]}"
        else:
            raise SystemExit(f"make_families: no GGUF name for {name}")
        if gemma_norms and name.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp's converter stores Gemma's (1 + w)
        # Matrices in F16 (their values are float16 already), vectors in F32 (Gemma's 1 + w is not).
        w.add_tensor(out, np.ascontiguousarray(a, dtype=np.float16 if a.ndim == 2 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Qwen2's pre-tokenizer split (its tokenizer.json and llama.cpp's "qwen2"): like Llama-3's, digits one by one.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # control tokens
USER_DEFINED = ["<tool_call>", "</tool_call>"]  # added, not special: matched in text, as Qwen2.5's


def hostile_corpus():
    """Strings the tokenizers are compared on: whitespace runs, digits, CJK, emoji, combining marks (NFC), code."""
    out = ["", " ", "  ", "\n", "\n\n\n", " \n ", "\t\t", "a\tb", "hello world", "Hello World!", "  leading spaces",
           "trailing spaces   ", "multiple    inner     spaces", "line\r\nbreaks\rand\nmore", "12345678901234567890",
           "3.14159 and 2,718", "year 2026-12-07 at 01:46", "x1y22z333", "日本語のテキストです。", "中文分词测试，标点！",
           "한국어 문장", "emoji 😀🎉👍🏽 family 👨‍👩‍👧", "café naïve résumé", "cafe\u0301 (combining accent)",
           "A\u030a vs \u00c5 (NFC)", "Ǆ ǅ ǆ ligatures", "ﬁ ﬂ ﬀ", "Ελληνικά και русский", "עברית ועربية",
           "I'm you're they've we'd he'll she's IT'S", "'quoted' \"double\"", "don't DON'T Don'T",
           "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
           "<|im_start|>user\nhi<|im_end|>", "<tool_call>{\"name\": \"f\"}</tool_call>", "<|not_a_token|>",
           "a<tool_call>b", "....!!!???", "---===+++", "__init__ __main__", "http://example.com/a?b=c&d=e",
           "mixed \t \n \u3000 spaces", "\u00a0non-breaking\u00a0space", "zero\u200bwidth", "\ufeffBOM",
           "🙂" * 5, "ab" * 40, " " * 17 + "x", "\n" * 9 + "y", "ÀÁÂÃÄÅàáâãäå", "the quick brown fox jumps over 13 lazy dogs"]
    return out


def make_tokenizer():
    """A byte-level BPE in Qwen2's layout (NFC, its split, byte-level, added tokens), trained on training/prompt_passages.txt."""
    from tokenizers import Tokenizer, models, pre_tokenizers, normalizers, decoders, trainers, Regex
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    texts = []
    for rel in ("training/prompt_passages.txt",):  # frozen text: the files stay the same when README.md changes
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            texts.append(f.read())
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(USER_DEFINED), special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens(USER_DEFINED)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


SPM_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]  # ids 0-5, Gemma's order
SPM_USER_DEFINED = ["\n\n", "<table>"]  # added, not special: Gemma's newline runs and markup tokens


def make_spm_tokenizer(layout):
    """A SentencePiece-style BPE (byte fallback, spaces as U+2581) in Gemma's tokenizer.json layout (normalizer
    Replace " " -> U+2581, pre-tokenizer Split on " " merged with the previous piece) or legacy Llama's (normalizer
    Prepend U+2581 then Replace, no pre-tokenizer): ids 0-5 the special tokens, 6-261 the byte tokens <0x00>..<0xFF>
    as ordinary vocabulary, then pieces trained by `tokenizers` on training/prompt_passages.txt, then the added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, normalizers, decoders, trainers
    spm_normalizer = (normalizers.Replace(" ", "\u2581") if layout == "gemma" else
                      normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]))
    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.normalizer = spm_normalizer
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    texts = []
    for rel in ("training/prompt_passages.txt",):  # frozen text: the files stay the same when README.md changes
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            texts.append(f.read())
    n_learned = VOCAB - len(SPM_SPECIALS) - 256 - len(SPM_USER_DEFINED)
    learner.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=n_learned, limit_alphabet=60, show_progress=False))
    learned = json.loads(learner.to_str())["model"]
    vocab = {t: i for i, t in enumerate(SPM_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [m if isinstance(m, str) else " ".join(m) for m in learned["merges"]]
    merges = [m for m in merges if "".join(m.split(" ")) in vocab]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    tok.normalizer = spm_normalizer
    if layout == "gemma":
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    # As transformers' SentencePiece converters add them: matched in the raw text (normalized=False).
    tok.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True) for t in SPM_SPECIALS])
    tok.add_tokens([tokenizers.AddedToken(t, normalized=False, special=False) for t in SPM_USER_DEFINED])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def write_tokenizer_cases(tok, path):
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in hostile_corpus()]
    with open(path, "w") as f:
        f.write('{"tokenizers": %s, "cases": [\n' % json.dumps(tokenizers.__version__))
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")


def write_gguf_tokenizer(w, tok):
    """The same vocabulary as llama.cpp's gpt2 tokenizer metadata with pre-tokenizer "qwen2"."""
    j = json.loads(tok.to_str())
    vocab = {t: i for t, i in j["model"]["vocab"].items()}
    types = [1] * VOCAB
    for a in j["added_tokens"]:
        vocab[a["content"]] = a["id"]
        types[a["id"]] = 3 if a["special"] else 4
    tokens = [None] * VOCAB
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_add_bos_token(False)


def reference(model, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, size=POSITIONS).tolist()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].to(torch.float32).numpy()
        out = model.generate(torch.tensor([ids]), max_new_tokens=CONTINUATION, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=CONTINUATION)
    greedy = out[0, POSITIONS:].tolist()
    with torch.no_grad():  # the same forward in float64: how far float32 itself is from the exact values
        logits64 = copy.deepcopy(model).to(torch.float64)(torch.tensor([ids])).logits[0].numpy()
    rows = lambda a: [[round(float(v), 7) for v in row] for row in a]
    return {"ids": ids, "logits": rows(logits), "logits_float64": rows(logits64), "greedy": greedy,
            "float32_vs_float64": float(np.abs(logits - logits64).max())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/families", help="the output folder")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", choices=sorted(FAMILIES), help="one family")
    args = ap.parse_args()
    torch.set_num_threads(2)
    for i, family in enumerate(sorted(FAMILIES)):
        if args.only and family != args.only:
            continue
        model = make_model(family, args.seed + 100 * i)
        d = os.path.join(args.out, family)
        os.makedirs(d, exist_ok=True)
        # The same values, half the bytes (a copy: .to() would also round the RoPE frequencies buffer).
        copy.deepcopy(model).to(torch.float16).save_pretrained(d, safe_serialization=True)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        tok = None
        if family == "qwen2":  # its tokenizer.json (and the same vocabulary in its GGUF), against `tokenizers`
            tok = make_tokenizer()
            tok.save(os.path.join(d, "tokenizer.json"))
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False,
                           "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                                            "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"}, f, indent=1)
                f.write("\n")
            write_tokenizer_cases(tok, os.path.join(args.out, "qwen2_tokenizer.json"))
        elif family in ("gemma3", "llama"):  # SentencePiece-style tokenizer.json (Gemma's, legacy Llama-2's layout)
            spm = make_spm_tokenizer("gemma" if family == "gemma3" else "llama")
            spm.save(os.path.join(d, "tokenizer.json"))
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"eos_token": "<eos>", "bos_token": "<bos>", "add_bos_token": True}, f, indent=1)
                f.write("\n")
            write_tokenizer_cases(spm, os.path.join(args.out, f"{family}_tokenizer.json"))
        write_gguf(model, family, os.path.join(args.out, f"{family}.gguf"), tok)
        ref = reference(model, args.seed + 100 * i + 2)
        ref.update({"family": family, "transformers": transformers.__version__, "torch": torch.__version__})
        with open(os.path.join(args.out, f"{family}.json"), "w") as f:
            json.dump(ref, f, separators=(",", ":"))
            f.write("\n")
        print(f"make_families: {family}: {sum(p.numel() for p in model.parameters())} parameters -> {d}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
