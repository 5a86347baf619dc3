#!/usr/bin/env python3
"""tools/compare_continuations.py — greedy continuations of specactor and llama.cpp on the same GGUF.

Starts llama.cpp's llama-server (built by tools/compare-llamacpp --build-only) and `specactor serve` on
free loopback ports, then for every prompt:
  * both tokenizers' ids for the text (llama.cpp's are the ones both forwards then get);
  * a greedy continuation of N tokens from each (end-of-generation tokens ignored), compared whole;
  * top-1 agreement, teacher-forced along llama.cpp's continuation: at each of its N positions, is
    specactor's greedy next token (given the prompt and llama.cpp's tokens so far) llama.cpp's token?
Prints one JSON object (per model: identical continuations, top-1 agreement, tokenizer agreement, and
each prompt's first divergence). Standard library only.

    python3 tools/compare_continuations.py --llama-bin DIR --specactor build/specactor --model M.gguf
        [--threads T] [--tokens 32] [--prompts FILE] [--precision fast|exact]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The three primary colours are",
    "Photosynthesis is the process by which",
    "1, 2, 3, 4, 5,",
    "The best way to learn a new language is",
    "Water boils at 100 degrees Celsius because",
    "In 1969, the first humans",
    "Here is a list of fruits: apple, banana,",
    "The main difference between a virus and a bacterium is",
    "To make a cup of tea, first",
    "import numpy as np\n\ndef normalize(x):\n",
    "The quick brown fox",
    "Dear Sir or Madam,\n\nI am writing to",
    "The Pythagorean theorem states that",
    "SELECT name, age FROM users WHERE",
    "Q: What is the largest planet in the solar system?\nA:",
    "The history of the Roman Empire begins",
    "My favourite book is",
    "Climate change is caused by",
    "A haiku about autumn:\n",
    "The function returns -1 when",
    "Translate to French: 'Good morning' ->",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=300):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(port, proc, what, path="/health"):
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"compare_continuations: {what} exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"compare_continuations: {what} not ready after 120 s")


def llama_continue(port, ids, n):
    body = {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1, "ignore_eos": True,
            "cache_prompt": True, "return_tokens": True, "samplers": ["top_k"]}
    return post(port, "/completion", body)["tokens"]


def spec_continue(port, ids, n):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    return post(port, "/generate", body)["output_ids"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, help="the folder with llama-server")
    ap.add_argument("--specactor", default="build/specactor")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", help="JSON lines with {\"prompt\"} (default: the 24 built in)")
    ap.add_argument("--precision", choices=["fast", "exact"], default="fast")
    args = ap.parse_args()
    prompts = PROMPTS
    if args.prompts:
        with open(args.prompts) as f:
            prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    lp, sp = free_port(), free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(
            [os.path.join(args.llama_bin, "llama-server"), "-m", args.model, "-t", str(args.threads), "-c", "4096",
             "--port", str(lp), "--host", "127.0.0.1", "-np", "1", "--no-webui"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(
            [args.specactor, "serve", "--model-path", args.model, "--port", str(sp), "--threads", str(args.threads),
             "--speculative-algorithm", "NONE", "--cpu-precision", args.precision, "--context-length", "4096"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_ready(lp, procs[0], "llama-server")
        wait_ready(sp, procs[1], "specactor serve")
        same_tok = identical = agree = total = 0
        cases = []
        for text in prompts:
            ids = post(lp, "/tokenize", {"content": text, "add_special": True})["tokens"]
            mine = post(sp, "/tokenize", {"prompt": text})["tokens"]
            same_tok += ids == mine
            ref = llama_continue(lp, ids, args.tokens)
            got = spec_continue(sp, ids, args.tokens)
            identical += ref == got
            first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
            hits = 0
            for i in range(len(ref)):
                hits += spec_continue(sp, ids + ref[:i], 1)[0] == ref[i]
            agree += hits
            total += len(ref)
            cases.append({"prompt": text, "tokenizer_equal": ids == mine, "identical": ref == got,
                          "first_divergence": first, "top1_agreement": hits / max(1, len(ref))})
        out = {"model": os.path.basename(args.model), "threads": args.threads, "precision": args.precision,
               "prompts": len(prompts), "tokens": args.tokens,
               "identical_continuations": identical, "identical_share": identical / len(prompts),
               "top1_agreement": agree / max(1, total), "tokenizer_equal": same_tok, "cases": cases}
        print(json.dumps(out, indent=1))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
