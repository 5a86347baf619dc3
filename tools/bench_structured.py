"""tools/bench_structured.py — what constrained decoding costs and what speculation gives it, at batch 1
(run by tools/bench-structured; Python's standard library only).

For each schema of a set (tools/structured_schemas.py: the 50 of the conformance checks, and a
held-out 20) one server answers, in turn: (1) plain constrained ("speculative": false with the
schema) while the schema is new to the server, (2) plain unconstrained with ignore_eos and max_tokens
set to (1)'s token count, so both decode the same number of tokens, (3) plain constrained again (its
masks cached), (4) speculative constrained (the server's drafter and the grammar's jump-forward
drafts). Decode speed = (completion tokens - 1) / (time from the first streamed token to the last).
Reports tokens per second of each and the ratios: (1)/(2) and (3)/(2) are what the grammar costs for a
new and a repeated schema, (4)/(3) what speculation gives constrained decoding. Checks that the
three constrained texts are equal.
"""
import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import structured_schemas  # noqa: E402
from bench_multiturn import Server  # noqa: E402  (a `specactor serve` on a free loopback port)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(base, body):
    """(text, completion tokens, decode seconds) of one streamed chat request."""
    body = dict(body, stream=True, stream_options={"include_usage": True}, temperature=0)
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    text, tokens, first, last = "", 0, None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                tokens = d["usage"]["completion_tokens"]
            for c in d.get("choices", []):
                if c["delta"].get("content"):
                    now = time.time()
                    first = first or now
                    last = now
                    text += c["delta"]["content"]
    return text, tokens, (last - first) if first else 0.0


def bench(srv, schemas, max_tokens):
    """Per schema, in turn: constrained plain with the schema new to the server (cold: every mask is
    computed), unconstrained plain of as many tokens, constrained plain again (warm: the masks are
    cached, as for a schema that serves many requests), speculative constrained (warm)."""
    keys = ("cold", "free", "constrained", "speculative")
    totals = {k: [0, 0.0] for k in keys}
    same = 0
    for name, prompt, schema in schemas:
        msgs = [{"role": "user", "content": prompt + " Answer in JSON."}]
        rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        plain = {"messages": msgs, "max_tokens": max_tokens, "response_format": rf, "speculative": False}
        text, n, t = run(srv.base, plain)
        _, n2, t2 = run(srv.base, {"messages": msgs, "max_tokens": max(n, 2), "ignore_eos": True,
                                   "speculative": False})
        text3, n3, t3 = run(srv.base, plain)
        spec_text, n4, t4 = run(srv.base, {"messages": msgs, "max_tokens": max_tokens, "response_format": rf})
        same += spec_text == text == text3
        for key, (k, s) in zip(keys, ((n, t), (n2, t2), (n3, t3), (n4, t4))):
            totals[key][0] += max(k - 1, 0)
            totals[key][1] += s
    rate = {k: v[0] / v[1] if v[1] > 0 else 0.0 for k, v in totals.items()}
    return rate, same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algorithm", action="append", default=[],
                    help="drafters to run (NGRAM, EAGLE3 = the shipped head); default both")
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    algos = args.algorithm or ["NGRAM", "EAGLE3"]
    head = os.path.join(ROOT, "heads", "SmolLM2-135M-Instruct-eagle3")
    results = []
    for algo in algos:
        flags = ["--speculative-algorithm", algo]
        if algo == "EAGLE3":
            flags += ["--speculative-draft-model-path", head]
        srv = Server(*flags)
        try:
            for set_name, schemas in (("shipped 50", structured_schemas.SCHEMAS),
                                      ("held-out 20", structured_schemas.HELDOUT)):
                rate, same = bench(srv, schemas, args.max_tokens)
                m = {}
                with urllib.request.urlopen(srv.base + "/metrics") as r:
                    for line in r.read().decode().splitlines():
                        if line.startswith("specactor:grammar_forced_drafts_total"):
                            m["forced"] = float(line.split()[-1])
                row = {"algorithm": algo, "set": set_name, "schemas": len(schemas), **rate,
                       "cost_cold": 1 - rate["cold"] / rate["free"] if rate["free"] else None,
                       "cost_warm": 1 - rate["constrained"] / rate["free"] if rate["free"] else None,
                       "speedup": rate["speculative"] / rate["constrained"] if rate["constrained"] else None,
                       "same_text": same, "forced_drafts_so_far": m.get("forced")}
                results.append(row)
                print(f"{algo:7s} {set_name:12s} plain {rate['free']:6.1f} tok/s | constrained, new schema "
                      f"{rate['cold']:6.1f} (cost {100 * row['cost_cold']:4.1f} %), cached {rate['constrained']:6.1f} "
                      f"(cost {100 * row['cost_warm']:4.1f} %) | speculative constrained {rate['speculative']:6.1f} "
                      f"({row['speedup']:.2f}x cached) | same text {same}/{len(schemas)}", flush=True)
        finally:
            srv.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if any(r["same_text"] != r["schemas"] for r in results):
        raise SystemExit("bench-structured: a speculative answer differs from the plain one")


if __name__ == "__main__":
    main()
