#!/usr/bin/env python3
"""tools/serve_model_check.py — `specactor serve` with any model, driven by the pinned openai client.

Starts the server on a free loopback port with the given model (and any extra server flags), then
checks through the openai client: a greedy completion, a seeded streamed completion (twice: the same
text), and the chat endpoint — answered when the model has a chat format (or --chat-template names
one), else refused with a 400 that names --chat-template. Prints what it got; exits non-zero when a
check fails. Run with .venv-serve/bin/python (tools/serve-e2e creates it).

    .venv-serve/bin/python tools/serve_model_check.py --model models/gemma-3-270m-q4_k_m.gguf [-- FLAGS]
"""
import argparse
import socket
import subprocess
import sys
import time
import urllib.request

from openai import OpenAI, BadRequestError


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--specactor", default="build/specactor")
    ap.add_argument("flags", nargs="*", help="extra server flags (after --)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([args.specactor, "serve", "--model-path", args.model, "--port", str(port)] + args.flags,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    failures = 0
    try:
        for _ in range(600):
            if proc.poll() is not None:
                sys.exit(f"serve_model_check: the server exited: {proc.stderr.read()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except Exception:
                time.sleep(0.2)
        c = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        model = c.models.list().data[0].id
        r = c.completions.create(model=model, prompt="The three primary colours are", max_tokens=16, temperature=0)
        print(f"completion: {r.choices[0].text!r} ({r.usage.completion_tokens} tokens, {r.choices[0].finish_reason})")
        failures += not r.choices[0].text
        texts = []
        for _ in range(2):
            s = c.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0.8, seed=7,
                                     stream=True)
            texts.append("".join(ch.choices[0].text for ch in s if ch.choices))
        print(f"seeded stream, twice: {texts[0]!r} / {'the same' if texts[0] == texts[1] else repr(texts[1])}")
        failures += texts[0] != texts[1] or not texts[0]
        try:
            r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a colour."}],
                                          max_tokens=16, temperature=0)
            print(f"chat: {r.choices[0].message.content!r} ({r.choices[0].finish_reason})")
            failures += not r.choices[0].message.content
        except BadRequestError as e:
            print(f"chat: refused, {e.status_code}: {e.body}")
            failures += "--chat-template" not in str(e.body)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("serve_model_check:", "ok" if failures == 0 else f"{failures} check(s) failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
