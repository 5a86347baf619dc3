"""tools/bench_cluster.py — a front over engine replicas, measured (run by tools/bench-cluster).

  scaling:   one worker, then two, each pinned to its own core (taskset) with --threads 1, behind
             `specactor serve --workers`; R requests per worker, C per worker at a time (the offered
             load grows with the workers, so each runs the same batch), ignore_eos, max_tokens M, of
             distinct prompts; aggregate completion tok/s. Rounds alternate 1 and 2 workers.
  multi-turn: K conversations of T turns (each answer appended, the next question added) through a
             front over one worker, over two with cache-aware routing and over two round-robin;
             prefix-cache hit rate = cached prompt tokens / prompt tokens (the API's usage), and
             the greedy answers compared across the three.

  python3 tools/bench_cluster.py [--rounds 2] [--requests 48] [--concurrency 16] [--max-tokens 64]   (per worker)
                                 [--conversations 8] [--turns 6] [--answer 32] [--json FILE]
Needs at least two cores. Python's standard library only.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SPECACTOR_BIN", os.path.join(ROOT, "build", "specactor"))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TOPICS = ["volcanoes", "bees", "the printing press", "glaciers", "bridges", "coral reefs", "jazz", "satellites",
          "tea", "chess", "deserts", "owls", "trains", "bread", "the moon", "rivers"]
QUESTIONS = ["Tell me about {t} in a few sentences.", "What is the most surprising fact about them?",
             "How do people use or study {t} today?", "Give one common misconception about {t}.",
             "Summarise our conversation in two sentences.", "What should I read next to learn more?",
             "Explain it to a ten-year-old.", "Any final thought?"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Cluster:
    def __init__(self, n, routing, log, pin=True, threads=1):
        self.procs = []
        ports = []
        for i in range(n):
            port = free_port()
            cmd = [BIN, "worker", "--model-path", MODEL, "--port", str(port), "--threads", str(threads),
                   "--log-level", "warn"]
            if pin:
                cmd = ["taskset", "-c", str(i % os.cpu_count())] + cmd
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
            self.procs.append(p)
            line = p.stdout.readline()
            if "listening" not in line:
                raise SystemExit(f"bench-cluster: a worker did not start ({line!r}); log: {log.name}")
            ports.append(port)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        front = subprocess.Popen([BIN, "serve", "--model-path", MODEL, "--port", str(self.port), "--log-level", "warn",
                                  "--workers", ",".join(f"127.0.0.1:{p}" for p in ports), "--routing", routing,
                                  "--max-queued-requests", "4096"], stdout=log, stderr=log)
        self.procs.append(front)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.05)
        raise SystemExit(f"bench-cluster: the front did not come up; log: {log.name}")

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def throughput(base, requests, concurrency, max_tokens):
    prompts = [f"Write a short story about {TOPICS[i % len(TOPICS)]} number {i}." for i in range(requests)]
    tokens, lock, nxt = [0], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                if nxt[0] >= len(prompts):
                    return
                i = nxt[0]
                nxt[0] += 1
            r = post(base + "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": prompts[i]}], "max_tokens": max_tokens,
                      "temperature": 0, "ignore_eos": True})
            with lock:
                tokens[0] += r["usage"]["completion_tokens"]

    t0 = time.time()
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return tokens[0] / (time.time() - t0)


def multiturn(base, conversations, turns, answer):
    out = {"prompt": 0, "cached": 0, "answers": {}}
    lock = threading.Lock()

    def conv(c):
        topic = TOPICS[c % len(TOPICS)]
        msgs, answers = [], []
        for t in range(turns):
            msgs.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)].format(t=topic)})
            r = post(base + "/v1/chat/completions", {"messages": msgs, "max_tokens": answer, "temperature": 0})
            text = r["choices"][0]["message"]["content"]
            msgs.append({"role": "assistant", "content": text})
            answers.append(text)
            with lock:
                out["prompt"] += r["usage"]["prompt_tokens"]
                out["cached"] += r["usage"]["prompt_tokens_details"]["cached_tokens"]
        with lock:
            out["answers"][c] = answers

    ts = [threading.Thread(target=conv, args=(c,)) for c in range(conversations)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out["hit_rate"] = out["cached"] / max(1, out["prompt"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench-cluster: needs at least two cores (one per worker)")
    import tempfile
    log = tempfile.NamedTemporaryFile(prefix="specactor-bench-cluster-", suffix=".log", delete=False, mode="w")
    result = {"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t"),
              "scaling": [], "multiturn": {}}
    if not a.skip_scaling:
        for rnd in range(a.rounds):
            for n in ([1, 2] if rnd % 2 == 0 else [2, 1]):
                c = Cluster(n, "cache-aware", log)
                try:
                    tps = throughput(c.base, a.requests * n, a.concurrency * n, a.max_tokens)
                finally:
                    c.stop()
                print(f"scaling: round {rnd + 1}, {n} worker(s): {tps:.1f} tok/s", flush=True)
                result["scaling"].append({"round": rnd + 1, "workers": n, "tokens_per_s": tps})
        ones = [r["tokens_per_s"] for r in result["scaling"] if r["workers"] == 1]
        twos = [r["tokens_per_s"] for r in result["scaling"] if r["workers"] == 2]
        ratios = [t / o for o, t in zip(ones, twos)]
        result["scaling_ratio"] = ratios
        print("scaling: two workers / one, per round: " + ", ".join(f"{x:.2f}x" for x in ratios), flush=True)
    for label, n, routing in (("one replica", 1, "cache-aware"), ("two, cache-aware", 2, "cache-aware"),
                              ("two, round-robin", 2, "round-robin")):
        c = Cluster(n, routing, log, pin=True)
        try:
            m = multiturn(c.base, a.conversations, a.turns, a.answer)
        finally:
            c.stop()
        result["multiturn"][label] = m
        print(f"multi-turn: {label}: {m['cached']} of {m['prompt']} prompt tokens cached ({100 * m['hit_rate']:.1f} %)",
              flush=True)
    mt = result["multiturn"]
    same = all(mt[k]["answers"] == mt["one replica"]["answers"] for k in mt)
    one = mt["one replica"]["hit_rate"]
    for k in ("two, cache-aware", "two, round-robin"):
        print(f"multi-turn: {k}: {mt[k]['hit_rate'] / one:.2f} of the single replica's hit rate", flush=True)
    print(f"multi-turn: answers identical across the three: {'yes' if same else 'NO'}", flush=True)
    for k in mt:
        del mt[k]["answers"]
    result["multiturn_answers_identical"] = same
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    log.close()
    os.unlink(log.name)


if __name__ == "__main__":
    main()
