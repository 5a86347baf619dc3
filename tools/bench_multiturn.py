"""tools/bench_multiturn.py — multi-turn chat and a shared system prompt through `specactor serve`,
with the prefix cache and without (--disable-radix-cache), alternating (run by tools/bench-multiturn).

  conversations: N conversations of T turns; each user turn is a new question, each answer is
                 generated greedily (max_tokens A) and appended, so the context grows turn by turn;
                 per turn: TTFT (streamed, to the first content chunk), cached prompt tokens.
  shared prefix: R concurrent requests with the same long system prompt and different questions:
                 aggregate completion time, cached tokens.
Checks that the cached and the cache-less server give the same answers (greedy) and prints medians.

  python3 tools/bench_multiturn.py [--conversations 4] [--turns 8] [--answer 48] [--shared 16]
                                   [--system-tokens 1000] [--algorithm NONE] [--json FILE]
                                   [--llama-server PATH]   (tools/compare-llamacpp --build-only builds it)
                                   [--serve-flags "FLAGS"] [--skip-shared]
"""
import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SPECACTOR_BIN", os.path.join(ROOT, "build", "specactor"))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

QUESTIONS = [
    "Explain in a few sentences how a refrigerator keeps food cold.",
    "Now compare that with how an air conditioner works.",
    "What would happen if the compressor stopped working?",
    "Give three tips to make a refrigerator use less energy.",
    "Summarise everything we discussed so far in one paragraph.",
    "Which of those tips saves the most, and why?",
    "Write a short poem about a humming fridge.",
    "Thank you. One last question: how long does a fridge usually last?",
    "And what should be done with an old one?",
    "Finally, list the key points of this conversation.",
]
TOPICS = ["a refrigerator", "the water cycle", "a bicycle gear", "a library", "a volcano", "a beehive",
          "the moon's phases", "a sailboat"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *flags, llama_server=None, threads=2, slots=16):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="specactor-multiturn-", suffix=".log", delete=False)
        if llama_server:  # llama.cpp's server: the same GGUF and threads, one slot per concurrent request
            cmd = [llama_server, "-m", MODEL, "-t", str(threads), "--host", "127.0.0.1", "--port", str(self.port),
                   "-np", str(slots), "-c", str(2048 * slots)]
        else:
            cmd = [BIN, "serve", "--model-path", MODEL, "--host", "127.0.0.1", "--port", str(self.port), *flags]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"bench-multiturn: the server exited; log: {self.log.name}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise SystemExit("bench-multiturn: the server did not start")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        self.log.close()
        os.unlink(self.log.name)


def chat(base, messages, max_tokens):
    """A streamed greedy chat: (answer, TTFT s, total s, usage)."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    ttft, text, usage = None, "", {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if "error" in j:
                raise SystemExit(f"bench-multiturn: error event {j['error']}")
            if j.get("usage"):
                usage = j["usage"]
            for c in j.get("choices", []):
                d = c.get("delta", {}).get("content")
                if d:
                    if ttft is None:
                        ttft = time.time() - t0
                    text += d
    return text, ttft if ttft is not None else time.time() - t0, time.time() - t0, usage


def conversations(base, n, turns, answer):
    per_turn = [[] for _ in range(turns)]  # TTFT per turn over conversations
    cached = [[] for _ in range(turns)]
    prompt = [[] for _ in range(turns)]
    answers = []
    t0 = time.time()
    for c in range(n):
        msgs = [{"role": "system", "content": f"You are a patient teacher. Today's topic is {TOPICS[c % len(TOPICS)]}."}]
        for t in range(turns):
            msgs.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            text, ttft, _, usage = chat(base, msgs, answer)
            msgs.append({"role": "assistant", "content": text})
            per_turn[t].append(ttft)
            cached[t].append(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))
            prompt[t].append(usage.get("prompt_tokens", 0))
            answers.append(text)
    return {"ttft": per_turn, "cached": cached, "prompt": prompt, "answers": answers, "total_s": time.time() - t0}


def shared_prefix(base, r, system_tokens, answer):
    # A long system prompt: numbered rules, about `system_tokens` tokens of this tokenizer (~1.3 per word).
    words = []
    i = 0
    while len(words) < system_tokens * 0.7:
        i += 1
        words += f"Rule {i}: answer politely, stay on topic, and keep each reply short and clear.".split()
    system = " ".join(words)
    results = [None] * r

    def one(k):
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": f"In one sentence, what is {TOPICS[k % len(TOPICS)]}? (question {k})"}]
        results[k] = chat(base, msgs, answer)

    # All at once, nothing cached before: the prompt is cached as soon as the first one is prefilled.
    t0 = time.time()
    threads = [threading.Thread(target=one, args=(k,)) for k in range(r)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    return {"wall_s": wall, "answers": [x[0] for x in results],
            "cached": [x[3].get("prompt_tokens_details", {}).get("cached_tokens", 0) for x in results],
            "prompt_tokens": results[0][3].get("prompt_tokens", 0)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--answer", type=int, default=48)
    ap.add_argument("--shared", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--algorithm", default="NONE")
    ap.add_argument("--json", default="")
    ap.add_argument("--llama-server", default="", help="also run llama.cpp's llama-server binary (cache_prompt on)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--serve-flags", default="", help="more flags for both specactor servers (one string)")
    ap.add_argument("--skip-shared", action="store_true", help="run the conversations only")
    ap.add_argument("--rounds", type=int, default=1, help="repeat, alternating the order of the servers")
    args = ap.parse_args()
    flags = ["--speculative-algorithm", args.algorithm, "--log-level", "warn", "--threads", str(args.threads),
             *shlex.split(args.serve_flags)]
    runs = [("cache", [], None), ("no cache", ["--disable-radix-cache"], None)]
    if args.llama_server:
        runs.append(("llama-server", [], args.llama_server))
    rounds, failed = [], False
    for rnd in range(args.rounds):  # alternating: every other round runs the servers in reverse order
        out = {}
        for label, extra, llama in (runs if rnd % 2 == 0 else list(reversed(runs))):
            srv = Server(*flags, *extra, llama_server=llama, threads=args.threads, slots=args.shared)
            try:
                out[label] = {"conv": conversations(srv.base, args.conversations, args.turns, args.answer),
                              "shared": {"wall_s": float("nan"), "answers": [], "cached": [0], "prompt_tokens": 0}
                              if args.skip_shared else shared_prefix(srv.base, args.shared, args.system_tokens,
                                                                     args.answer)}
                if not llama:
                    out[label]["metrics"] = scrape(srv.base)
            finally:
                srv.stop()
        if args.rounds > 1:
            print(f"--- round {rnd + 1} of {args.rounds} (order: "
                  f"{', '.join(x[0] for x in (runs if rnd % 2 == 0 else reversed(runs)))})")
        rounds.append(out)
        failed |= not report(args, out)
    if args.rounds > 1:
        def best(label, key):
            return min(r[label][key] for r in rounds)
        line = (f"over {args.rounds} alternating rounds, best of each: turns 2..{args.turns} median TTFT "
                f"{best('cache', 'later') * 1000:.1f} ms with the cache, {best('no cache', 'later') * 1000:.1f} ms "
                f"without; totals {best('cache', 'total'):.1f} s vs {best('no cache', 'total'):.1f} s")
        if args.llama_server:
            line += (f"; llama-server {best('llama-server', 'later') * 1000:.1f} ms, "
                     f"{best('llama-server', 'total'):.1f} s")
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rounds, f)
    if failed:
        raise SystemExit("bench-multiturn: the answers differ with and without the cache")


def scrape(base):
    """The server's /metrics counters as {name: value}."""
    values = {}
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    values[name] = float(value)
                except ValueError:
                    pass
    return values


def report(args, out):
    """Prints one round; returns whether the answers were the same with and without the cache."""
    a, b = out["cache"], out["no cache"]
    same = a["conv"]["answers"] == b["conv"]["answers"] and a["shared"]["answers"] == b["shared"]["answers"]
    print(f"bench-multiturn: {args.conversations} conversations x {args.turns} turns, answers of {args.answer} "
          f"tokens, --speculative-algorithm {args.algorithm}; answers identical with and without the cache: {same}")
    print("turn | prompt tokens (median) | cached (median) | TTFT cache ms | TTFT no cache ms | ratio")
    for t in range(args.turns):
        ta = statistics.median(a["conv"]["ttft"][t]) * 1000
        tb = statistics.median(b["conv"]["ttft"][t]) * 1000
        print(f"{t + 1:4d} | {statistics.median(a['conv']['prompt'][t]):6.0f} | "
              f"{statistics.median(a['conv']['cached'][t]):6.0f} | {ta:8.1f} | {tb:8.1f} | {tb / ta:5.2f}x")
    later_a = statistics.median([x for t in range(1, args.turns) for x in a["conv"]["ttft"][t]])
    later_b = statistics.median([x for t in range(1, args.turns) for x in b["conv"]["ttft"][t]])
    print(f"turns 2..{args.turns}: median TTFT {later_a * 1000:.1f} ms with the cache, {later_b * 1000:.1f} ms without "
          f"({later_b / later_a:.2f}x); conversations' total {a['conv']['total_s']:.1f} s vs {b['conv']['total_s']:.1f} s")
    hit = sum(x for t in range(1, args.turns) for x in a["conv"]["cached"][t])
    asked = sum(x for t in range(1, args.turns) for x in a["conv"]["prompt"][t])
    print(f"turns 2..{args.turns}: hit rate {100.0 * hit / asked if asked else 0.0:.1f} % "
          f"({hit} of {asked} prompt tokens from the cache)")
    if not args.skip_shared:
        pt = a["shared"]["prompt_tokens"]
        prefills = (args.shared * pt - sum(a["shared"]["cached"])) / pt if pt else float("nan")
        print(f"shared {args.system_tokens}-token system prompt ({pt} prompt tokens), {args.shared} concurrent: "
              f"{a['shared']['wall_s']:.2f} s with the cache (cached tokens median "
              f"{statistics.median(a['shared']['cached']):.0f}; prompt tokens prefilled = {prefills:.1f} prompts' "
              f"worth), {b['shared']['wall_s']:.2f} s without ({b['shared']['wall_s'] / a['shared']['wall_s']:.2f}x)")
    if args.llama_server:
        c = out["llama-server"]
        later_c = statistics.median([x for t in range(1, args.turns) for x in c["conv"]["ttft"][t]])
        print("llama-server (the same questions; its answers differ, so its contexts do too): per-turn median TTFT "
              + ", ".join(f"{statistics.median(c['conv']['ttft'][t]) * 1000:.0f}" for t in range(args.turns)) + " ms")
        print(f"turns 2..{args.turns}: median TTFT {later_a * 1000:.1f} ms specactor, {later_c * 1000:.1f} ms "
              f"llama-server ({later_c / later_a:.2f}x); conversations' total {a['conv']['total_s']:.1f} s vs "
              f"{c['conv']['total_s']:.1f} s; shared prompt x{args.shared}: {a['shared']['wall_s']:.2f} s vs "
              f"{c['shared']['wall_s']:.2f} s")
    for label in ("cache", "no cache", "llama-server"):
        if label in out:
            out[label]["later"] = statistics.median(
                [x for t in range(1, args.turns) for x in out[label]["conv"]["ttft"][t]])
            out[label]["total"] = out[label]["conv"]["total_s"]
    m = a.get("metrics", {})
    if m.get("specactor:draft_prefix_cache_queries_total", 0) > 0:
        print(f"the drafter's own prefix cache: {m['specactor:draft_prefix_cache_hits_total']:.0f} of "
              f"{m['specactor:draft_prefix_cache_queries_total']:.0f} draft KV slots found cached "
              f"({100.0 * m['specactor:draft_prefix_cache_hits_total'] / m['specactor:draft_prefix_cache_queries_total']:.1f} %)")
    return same


if __name__ == "__main__":
    main()
