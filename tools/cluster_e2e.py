"""tools/cluster_e2e.py — end-to-end checks of a front over engine replicas (run by tools/cluster-e2e).

On loopback, with the default model: three `specactor worker` processes and a front
(`specactor serve --workers`), and beside them a single-process `specactor serve` as the reference.
Checks, each printed as ok/FAIL (exit 1 on the first failure, naming it):
  - 64 concurrent greedy streams through the front: every text equals the single-process server's;
  - /server_info lists the three replicas up, with the hashes of their target and draft snapshots
    as the front received them equal to the hashes each replica computed of what its workers hold;
  - `kill -9` of a worker while 64 streams run: every stream ends (none hangs), either complete and
    equal to the reference or with an error event naming the worker; requests that had streamed
    nothing are retried on another replica; the front keeps answering;
  - the worker restarted on its port: the front takes it back and routes to it again;
  - a worker listening on a port another worker holds is refused with a clear error;
  - a remote draft worker (`worker --role draft`, `--speculative-draft-worker`): greedy outputs equal
    the local drafter's, its drafts are accepted; kill -9 of it mid-run: every request completes
    (plain decoding from then on), none is lost;
  - TLS (the worker's gate is the TLS server): a front whose certificate chains to the workers' CA is
    served, one of another CA (or none) is refused; bad TLS files stop a worker or a front at start,
    naming the flag (a FIFO does not hang); plain bytes and a certificate-less TLS client leave the
    worker serving;
  - hostile peers (actors/gate.hpp) at a worker with the cluster secret: 4 GiB frame headers, garbage
    and server-handshake frames, held connections and half frames, with and without the secret; fronts
    with another secret or none are refused with the reason; the worker serves the same answer after,
    in bounded memory; an empty --host is refused by worker and serve.
Uses only the Python standard library.
"""
import atexit
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "specactor")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PROCS = []


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what, flush=True)
    if not cond:
        raise SystemExit(f"cluster-e2e: failed: {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def start_worker(port, log):
    p = subprocess.Popen([BIN, "worker", "--model-path", MODEL, "--port", str(port), "--log-level", "warn"],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    PROCS.append(p)
    line = p.stdout.readline()
    check(line.startswith("specactor worker: listening on 127.0.0.1:"), f"worker on port {port} listens ({line.strip()!r})")
    return p


def start_server(flags, log):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    p = subprocess.Popen([BIN, "serve", "--model-path", MODEL, "--port", str(port), "--log-level", "warn", *flags],
                         stdout=log, stderr=log)
    PROCS.append(p)
    deadline = time.time() + 180
    while time.time() < deadline:
        if p.poll() is not None:
            raise SystemExit(f"cluster-e2e: a server exited with {p.returncode}; log: {log.name}")
        try:
            if http("GET", base + "/health", timeout=5)[0] == 200:
                return p, base
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"cluster-e2e: /health never answered 200; log: {log.name}")


def stream(base, prompt, max_tokens, out, key):
    """A streamed chat completion: out[key] = {"text", "finish", "error", "chunks"}."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    r = {"text": "", "finish": None, "error": None, "chunks": 0}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=180) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                j = json.loads(line[6:])
                if "error" in j:
                    r["error"] = j["error"]["message"]
                    continue
                for c in j.get("choices", []):
                    piece = c.get("delta", {}).get("content") or ""
                    if piece:
                        r["chunks"] += 1
                    r["text"] += piece
                    if c.get("finish_reason"):
                        r["finish"] = c["finish_reason"]
    except Exception as e:  # a hang shows as a timeout here
        r["error"] = f"client: {e!r}"
    out[key] = r


def run_streams(base, prompts, max_tokens):
    out, threads = {}, []
    for i, p in enumerate(prompts):
        t = threading.Thread(target=stream, args=(base, p, max_tokens, out, i))
        t.start()
        threads.append(t)
    return out, threads


def prompts(n):
    topics = ["the sea", "a mountain", "bread", "a red bicycle", "winter", "a library", "the moon", "coffee"]
    return [f"Write two sentences about {topics[i % len(topics)]} and the number {i}." for i in range(n)]


def replicas(base):
    return json.loads(http("GET", base + "/server_info")[1])["replicas"]


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def remote_draft_checks(log, single, ps, ref):
    print("cluster-e2e: a remote draft worker (the default EAGLE3 head, hidden rows over the wire)", flush=True)
    port = free_port()
    host = subprocess.Popen([BIN, "worker", "--role", "draft", "--model-path", MODEL, "--port", str(port),
                             "--log-level", "warn"], stdout=subprocess.PIPE, stderr=log, text=True)
    PROCS.append(host)
    line = host.stdout.readline()
    check("listening" in line, f"a draft host listens ({line.strip()!r})")
    # A fixed shape: every step drafts, so the check is of the wire, not of what the budget judges a
    # remote round worth with 24 streams on two cores (under that load it stops drafting, as it should).
    _, remote = start_server(["--speculative-draft-worker", f"127.0.0.1:{port}", "--speculative-adaptive", "false"], log)
    got, threads = run_streams(remote, ps[:24], 24)
    for t in threads:
        t.join(300)
    same = sum(got[i]["text"] == ref[i]["text"] and got[i]["error"] is None for i in range(24))
    check(same == 24, f"greedy outputs with the remote draft worker equal the local one's ({same}/24)")
    accepted = metric(remote, "specactor:spec_decode_num_accepted_tokens_total")
    check(accepted is not None and accepted > 0, f"the remote drafts are accepted ({accepted} tokens)")
    check(metric(remote, "specactor:spec_decode_draft_failures_total") == 0, "no draft failure so far")
    print("cluster-e2e: kill -9 of the remote draft worker while 24 streams run", flush=True)
    got, threads = run_streams(remote, ps[:24], 24)
    deadline = time.time() + 30
    while time.time() < deadline and not any(v["chunks"] > 0 for v in got.values()):
        time.sleep(0.01)
    host.send_signal(signal.SIGKILL)
    host.wait()
    for t in threads:
        t.join(300)
    check(all(not t.is_alive() for t in threads) and len(got) == 24, "no stream hangs: all 24 ended")
    same = sum(got[i]["text"] == ref[i]["text"] and got[i]["error"] is None for i in range(24))
    check(same == 24, f"every request completes, equal to the reference, after the draft worker died ({same}/24)")
    check(metric(remote, "specactor:spec_decode_draft_failures_total") >= 1,
          "the server counts the draft failure and decodes without drafts")
    r = http("POST", remote + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8,
                                                  "temperature": 0})
    check(r[0] == 200, "the server keeps answering without its draft worker")


def make_certs(d):
    """A CA with a worker and a front certificate, and a second CA with a certificate of its own."""
    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
    for ca in ("ca", "other"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
            "-subj", f"/CN=specactor test {ca}")
    for name, ca in (("worker", "ca"), ("front", "ca"), ("stranger", "other")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
            f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2")


def tls_checks(log):
    print("cluster-e2e: TLS with certificates made here", flush=True)
    with tempfile.TemporaryDirectory() as d:
        make_certs(d)
        f = lambda n: os.path.join(d, n)
        port = free_port()
        p = subprocess.Popen([BIN, "worker", "--model-path", MODEL, "--port", str(port), "--log-level", "warn",
                              "--tls-certificate", f("worker.pem"), "--tls-key", f("worker.key"), "--tls-ca", f("ca.pem")],
                             stdout=subprocess.PIPE, stderr=log, text=True)
        PROCS.append(p)
        line = p.stdout.readline()
        check(line.strip().endswith("(TLS)"), f"a worker listens with TLS ({line.strip()!r})")
        addr = f"127.0.0.1:{port}"
        _, front = start_server(["--workers", addr, "--worker-tls-certificate", f("front.pem"), "--worker-tls-key",
                                 f("front.key"), "--worker-tls-ca", f("ca.pem")], log)
        r = http("POST", front + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8,
                                                     "temperature": 0})
        check(r[0] == 200 and "Paris" in r[1], "a front whose certificate chains to the CA is served over TLS")
        for label, flags in (("a certificate of another CA", ["--worker-tls-certificate", f("stranger.pem"),
                                                              "--worker-tls-key", f("stranger.key"),
                                                              "--worker-tls-ca", f("ca.pem")]),
                             ("no TLS", [])):
            q = subprocess.run([BIN, "serve", "--model-path", MODEL, "--port", str(free_port()), "--workers", addr,
                                "--workers-wait", "3", *flags], capture_output=True, text=True, timeout=120)
            check(q.returncode == 2 and "no worker answered" in q.stderr,
                  f"a front with {label} is refused ({q.stderr.strip()[-140:]!r})")
        # A draft host with TLS: a scheduler with the CA's certificate drafts through it, one with
        # another CA's is refused and decodes without drafts (same text).
        dport = free_port()
        dh = subprocess.Popen([BIN, "worker", "--role", "draft", "--model-path", MODEL, "--port", str(dport),
                              "--log-level", "warn", "--tls-certificate", f("worker.pem"), "--tls-key",
                              f("worker.key"), "--tls-ca", f("ca.pem")], stdout=subprocess.PIPE, stderr=log, text=True)
        PROCS.append(dh)
        check(dh.stdout.readline().strip().endswith("(TLS)"), "a draft host listens with TLS")
        # A fixed shape here too: the check is of the TLS link, not of what the budget makes of its cost.
        gen = [BIN, "generate", "--model-path", MODEL, "--prompt", "Write a Python function that adds two numbers.",
               "--chat", "--max-new-tokens", "32", "--json", "--speculative-adaptive", "false",
               "--speculative-draft-worker", f"127.0.0.1:{dport}"]
        plain = json.loads(subprocess.run(gen[:-2] + ["--speculative-algorithm", "NONE"], capture_output=True,
                                          text=True, timeout=120).stdout)
        for label, cert, ok in (("the CA's", "front", True), ("another CA's", "stranger", False)):
            g = subprocess.run(gen + ["--speculative-draft-worker-tls-certificate", f(f"{cert}.pem"),
                                      "--speculative-draft-worker-tls-key", f(f"{cert}.key"),
                                      "--speculative-draft-worker-tls-ca", f("ca.pem")],
                               capture_output=True, text=True, timeout=120)
            j = json.loads(g.stdout) if g.returncode == 0 else {}
            spec = j.get("speculative", {})
            if ok:
                check(j.get("text") == plain["text"] and spec.get("accepted", 0) > 0,
                      f"a scheduler with {label} certificate drafts through the TLS draft host (accepted "
                      f"{spec.get('accepted')})")
            else:
                check(j.get("text") == plain["text"] and spec.get("drafted", 1) == 0 and "handshake" in g.stderr,
                      f"a scheduler with {label} certificate is refused and decodes without drafts")
        # Bad TLS files stop the start with the flag named (they used to pass until the first connection).
        fifo = f("fifo.pem")
        os.mkfifo(fifo)
        for label, files, flag in (("/etc/passwd", ["/etc/passwd"] * 3, "--tls-certificate"),
                                   ("a directory as key", [f("worker.pem"), d, f("ca.pem")], "--tls-key"),
                                   ("another pair's key", [f("worker.pem"), f("front.key"), f("ca.pem")], "--tls-key"),
                                   ("a FIFO", [fifo, f("worker.key"), f("ca.pem")], "--tls-certificate")):
            q = subprocess.run([BIN, "worker", "--model-path", MODEL, "--port", "0", "--tls-certificate", files[0],
                                "--tls-key", files[1], "--tls-ca", files[2]], capture_output=True, text=True, timeout=60)
            check(q.returncode == 2 and flag in q.stderr and "listening" not in q.stdout,
                  f"a worker with {label} as TLS file stops at start naming {flag} ({q.stderr.strip()[-110:]!r})")
        q = subprocess.run([BIN, "serve", "--model-path", MODEL, "--port", str(free_port()), "--workers", addr,
                            "--worker-tls-certificate", "/etc/passwd", "--worker-tls-key", f("front.key"),
                            "--worker-tls-ca", f("ca.pem")], capture_output=True, text=True, timeout=60)
        check(q.returncode == 2 and "--worker-tls-certificate /etc/passwd: not a PEM file" in q.stderr,
              f"a front with a bad TLS file stops at start naming it, not blaming the workers ({q.stderr.strip()[-90:]!r})")
        # Hostile peers at the TLS worker: plain bytes, a TLS client without a certificate.
        rss0 = rss(p.pid)
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(basp_header(1, 0xFFFFFFF0) + os.urandom(200))
                s.settimeout(3)
                try:
                    s.recv(100)
                except OSError:
                    pass
        ctx = ssl.create_default_context(cafile=f("ca.pem"))
        ctx.check_hostname = False
        for _ in range(5):
            try:
                with socket.create_connection(("127.0.0.1", port)) as raw, ctx.wrap_socket(raw) as t:
                    t.sendall(basp_header(1, 0xFFFFFFF0))
                    t.recv(100)
            except (OSError, ssl.SSLError):
                pass
        r = http("POST", front + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8,
                                                     "temperature": 0})
        check(p.poll() is None and r[0] == 200 and "Paris" in r[1] and rss(p.pid) - rss0 < 100_000,
              f"the TLS worker still serves after plain and certificate-less peers (RSS +{rss(p.pid) - rss0} kB)")


def basp_header(op, length):
    """CAF 0.17's BASP frame header: operation, 2 padding bytes, flags, payload length, three 64-bit fields."""
    return struct.pack(">BBBBIQQQ", op, 0, 0, 0, length, 1, 0, 0)


def rss(pid):
    with open(f"/proc/{pid}/status") as fh:
        return int(next(l for l in fh if l.startswith("VmRSS")).split()[1])


GATE_CONTEXT = b"specactor worker gate 1: a front proves the cluster secret"


def prove(sock, secret):
    """The front's side of the worker gate's challenge (actors/gate.hpp). True when accepted."""
    sock.settimeout(5)
    challenge = b""
    while len(challenge) < 48:
        b = sock.recv(48 - len(challenge))
        if not b:
            return False
        challenge += b
    sock.sendall(hmac.new(secret, GATE_CONTEXT + challenge[16:], hashlib.sha256).digest())
    return sock.recv(1) == b"\x01"


def hostile_checks(log, reference):
    """Hostile peers at a worker's port (plain TCP, the cluster secret): oversized and garbage frames,
    held connections, connections without the secret; the worker must go on serving in bounded memory."""
    print("cluster-e2e: hostile peers at a worker (the cluster secret, no TLS)", flush=True)
    with tempfile.TemporaryDirectory() as d:
        secret_file = os.path.join(d, "secret")
        with open(secret_file, "w") as fh:
            fh.write("a cluster secret of this test, long enough\n")
        os.chmod(secret_file, 0o600)
        secret = open(secret_file, "rb").read().strip()
        port = free_port()
        w = subprocess.Popen([BIN, "worker", "--model-path", MODEL, "--port", str(port), "--log-level", "warn",
                              "--secret-file", secret_file], stdout=subprocess.PIPE, stderr=log, text=True)
        PROCS.append(w)
        check(w.stdout.readline().startswith("specactor worker: listening"), "a worker with a secret file listens")
        addr = f"127.0.0.1:{port}"
        _, front = start_server(["--workers", addr, "--worker-secret-file", secret_file], log)
        ask = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        r = http("POST", front + "/v1/completions", ask)
        check(r[0] == 200 and json.loads(r[1])["choices"][0]["text"] == reference,
              "a front that proves the secret is served")
        rss0 = rss(w.pid)
        # The probe's packet: a handshake header announcing ~4 GiB, from 50 connections at once, without
        # the secret (it is no answer to the challenge) and after proving it.
        held = []
        for i in range(50):
            s = socket.create_connection(("127.0.0.1", port))
            if i % 2 and not prove(s, secret):
                raise SystemExit("cluster-e2e: the secret was refused")
            s.sendall(basp_header(1, 0xFFFFFFF0))
            held.append(s)
        # Garbage: random bytes, a server handshake (operation 0) and random frames after the proof.
        for i in range(60):
            s = socket.create_connection(("127.0.0.1", port))
            if i % 3 and not prove(s, secret):
                raise SystemExit("cluster-e2e: the secret was refused")
            s.sendall(os.urandom(64) if i % 3 != 2 else basp_header(i % 2 * 7, 16) + os.urandom(16))
            held.append(s)
        # Held connections: nothing sent, or half a frame after the proof.
        for i in range(40):
            s = socket.create_connection(("127.0.0.1", port))
            if i % 2 and prove(s, secret):
                s.sendall(basp_header(1, 4096) + os.urandom(100))
            held.append(s)
        time.sleep(1)
        check(w.poll() is None, "the worker survived oversized and garbage frames")
        # Fronts without the secret, or with another one: refused, with the reason.
        other = os.path.join(d, "other")
        with open(other, "w") as fh:
            fh.write("not the cluster secret but long enough\n")
        os.chmod(other, 0o600)
        for label, flags, want in (("another secret", ["--worker-secret-file", other], "refused this side's"),
                                   ("no secret", ["--worker-secret-file", "none"], "asks for the cluster secret")):
            q = subprocess.run([BIN, "serve", "--model-path", MODEL, "--port", str(free_port()), "--workers", addr,
                                "--workers-wait", "3", *flags], capture_output=True, text=True, timeout=120)
            check(q.returncode == 2 and want in q.stderr,
                  f"a front with {label} is refused ({q.stderr.strip()[-150:]!r})")
        # The held connections are closed by their deadlines (10 s for the handshake); what they held is freed.
        time.sleep(11)
        for s in held:
            s.close()
        r = http("POST", front + "/v1/completions", ask)
        grown = rss(w.pid) - rss0
        check(w.poll() is None and r[0] == 200 and json.loads(r[1])["choices"][0]["text"] == reference,
              "after 150 hostile connections the worker serves the same answer")
        check(grown < 150_000, f"the worker's memory stayed bounded (RSS +{grown} kB; a 4 GiB header used to abort it)")
        q = subprocess.run([BIN, "worker", "--model-path", MODEL, "--host", "", "--port", "0"], capture_output=True,
                           text=True, timeout=60)
        check(q.returncode == 2 and "--host: an empty address" in q.stderr, "a worker refuses an empty --host")
        q = subprocess.run([BIN, "serve", "--model-path", MODEL, "--host", "", "--port", str(free_port())],
                           capture_output=True, text=True, timeout=60)
        check(q.returncode == 2 and "--host: an empty address" in q.stderr,
              "serve refuses an empty --host (it listened on every interface)")


def main():
    # The engines started here keep what the budget learns under $XDG_CACHE_HOME: this run's own folder,
    # not the user's (a run must neither read nor change the user's budget memory).
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="specactor-cluster-e2e-cache-")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)
    if not os.path.exists(MODEL):
        raise SystemExit("cluster-e2e: the default model is missing (run tools/setup)")
    # The workers' default cluster secret is made under $XDG_CONFIG_HOME: this run's own, not the user's.
    config_home = tempfile.mkdtemp(prefix="specactor-cluster-config-")
    os.environ["XDG_CONFIG_HOME"] = config_home
    log = tempfile.NamedTemporaryFile(prefix="specactor-cluster-", suffix=".log", delete=False, mode="w")
    try:
        ports = [free_port() for _ in range(3)]
        workers = [start_worker(p, log) for p in ports]
        _, front = start_server(["--workers", ",".join(f"127.0.0.1:{p}" for p in ports)], log)
        _, single = start_server([], log)

        print("cluster-e2e: 64 concurrent streams, front against a single-process server", flush=True)
        ps = prompts(64)
        ref, threads = run_streams(single, ps, 24)
        for t in threads:
            t.join(300)
        check(all(ref[i]["error"] is None and ref[i]["finish"] for i in range(64)), "the single-process server answers all 64")
        got, threads = run_streams(front, ps, 24)
        for t in threads:
            t.join(300)
        check(len(got) == 64 and all(not t.is_alive() for t in threads), "every stream through the front ended")
        same = sum(got[i]["text"] == ref[i]["text"] and got[i]["finish"] == ref[i]["finish"] for i in range(64))
        check(same == 64, f"greedy outputs through the front equal the single-process server's ({same}/64)")
        reps = replicas(front)
        check(len(reps) == 3 and all(r["state"] == "up" for r in reps), "/server_info: three replicas up")
        check(all(r["routed"] > 0 for r in reps), f"each replica served requests ({[r['routed'] for r in reps]})")
        check(all(r["target"]["hash"] == r["target_worker_hash_on_replica"] for r in reps),
              "each replica's target snapshot hash is the same on both sides of the wire")
        check(all((r["draft"] or {}).get("hash", "") == r["draft_worker_hash_on_replica"] for r in reps),
              "each replica's draft snapshot hash is the same on both sides of the wire")
        check(all(r["target_worker_holds_resolved_object"] for r in reps),
              "each replica's target worker holds its scheduler's resolved snapshot object")
        gen, pages = metric(front, "specactor:generation_tokens_total"), metric(front, "specactor:kv_pages_total")
        check(gen is not None and gen >= 64 and pages == 3 * metric(single, "specactor:kv_pages_total"),
              f"the front's /metrics sums its replicas' ({gen} tokens generated, {pages} KV pages)")

        print("cluster-e2e: kill -9 of a worker while 64 streams run", flush=True)
        ref_long, threads = run_streams(single, ps, 48)
        for t in threads:
            t.join(300)
        got, threads = run_streams(front, ps, 48)
        victim = None
        deadline = time.time() + 60
        while time.time() < deadline and victim is None:
            reps = replicas(front)
            busy = [i for i, r in enumerate(reps) if r["in_flight"] > 0]
            if busy and sum(r["chunks"] for r in got.values()) + sum(1 for t in threads if not t.is_alive()) >= 0:
                streamed = any(v["chunks"] > 0 for v in got.values())
                if streamed:
                    victim = max(busy, key=lambda i: reps[i]["in_flight"])
            time.sleep(0.05)
        check(victim is not None, "a worker had requests in flight while streams had started")
        in_flight = replicas(front)[victim]["in_flight"]
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait()
        for t in threads:
            t.join(240)
        check(all(not t.is_alive() for t in threads) and len(got) == 64, "no stream hangs: all 64 ended")
        complete = [i for i in range(64) if got[i]["error"] is None]
        failed = [i for i in range(64) if got[i]["error"] is not None]
        check(all(got[i]["text"] == ref_long[i]["text"] for i in complete),
              f"the {len(complete)} complete streams equal the single-process server's")
        check(all("went away" in got[i]["error"] for i in failed),
              f"the {len(failed)} cut streams end with an error naming the lost worker"
              + (f" ({got[failed[0]]['error'][:120]!r})" if failed else ""))
        reps = replicas(front)
        print(f"  ..   the killed worker had {in_flight} in flight: {reps[victim]['retried_elsewhere']} retried "
              f"elsewhere, {reps[victim]['failed']} cut", flush=True)
        check(reps[victim]["state"] in ("down", "connecting"), "the front marks the killed worker down")
        check(reps[victim]["retried_elsewhere"] + reps[victim]["failed"] >= 1,
              "the killed worker's requests were retried or ended")
        r = http("POST", front + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8,
                                                     "temperature": 0})
        check(r[0] == 200, "the front answers after losing a worker")

        print("cluster-e2e: the worker restarts on its port", flush=True)
        before = reps[victim]["routed"]
        workers[victim] = start_worker(ports[victim], log)
        deadline = time.time() + 30
        while time.time() < deadline and replicas(front)[victim]["state"] != "up":
            time.sleep(0.1)
        check(replicas(front)[victim]["state"] == "up", "the front takes the restarted worker back")
        fresh = [f"List {i + 2} animals that live in {place}." for i, place in
                 enumerate(["forests", "deserts", "oceans", "rivers", "caves", "cities", "mountains", "islands",
                            "swamps", "grasslands", "the arctic", "gardens"])]
        ref_fresh, threads = run_streams(single, fresh, 24)
        for t in threads:
            t.join(240)
        got, threads = run_streams(front, fresh, 24)
        for t in threads:
            t.join(240)
        check(all(got[i]["text"] == ref_fresh[i]["text"] and got[i]["error"] is None for i in range(12)),
              "outputs stay equal after the restart")
        check(replicas(front)[victim]["routed"] > before, "the restarted worker is routed to again")

        print("cluster-e2e: kill -9 of a worker while it prefills long prompts", flush=True)
        # Distinct from their first words (the prefix cache would make a shared text cheap to prefill).
        longs = [f"Question {i}: how many stones does item {i} hold?\n" +
                 " ".join(f"Item {k}: the {['red', 'green', 'blue', 'white'][(k + i) % 4]} box holds "
                          f"{(k * 7 + i) % 13} stones." for k in range(40)) for i in range(24)]
        ref_longs, threads = run_streams(single, longs, 8)
        for t in threads:
            t.join(300)
        got, threads = run_streams(front, longs, 8)
        victim2, deadline = None, time.time() + 30
        while time.time() < deadline and victim2 is None:
            reps = replicas(front)
            busy = [i for i, r in enumerate(reps) if r["in_flight"] >= 6]
            if busy:
                victim2 = busy[0]
            time.sleep(0.005)
        check(victim2 is not None, "a worker had requests in flight")
        streamed_before = sum(1 for v in got.values() if v["chunks"] > 0)
        retried_before = replicas(front)[victim2]["retried_elsewhere"]
        workers[victim2].send_signal(signal.SIGKILL)
        workers[victim2].wait()
        for t in threads:
            t.join(240)
        check(all(not t.is_alive() for t in threads) and len(got) == 24, "no stream hangs: all 24 ended")
        complete = [i for i in range(24) if got[i]["error"] is None]
        check(all(got[i]["text"] == ref_longs[i]["text"] for i in complete),
              f"the {len(complete)} complete streams equal the single-process server's")
        check(all("went away" in got[i]["error"] for i in range(24) if got[i]["error"] is not None),
              "the cut streams end with an error naming the lost worker")
        retried = replicas(front)[victim2]["retried_elsewhere"] - retried_before
        print(f"  ..   {streamed_before} streams had output when the worker died; {retried} requests retried "
              f"elsewhere, {24 - len(complete)} cut", flush=True)
        print("  ..   errors:", sorted({(got[i]["error"] or "")[:150] for i in range(24)}), flush=True)
        check(retried >= 1, "requests that had streamed nothing were retried on another replica and completed")
        workers[victim2] = start_worker(ports[victim2], log)

        print("cluster-e2e: a port another worker holds", flush=True)
        p = subprocess.run([BIN, "worker", "--model-path", MODEL, "--port", str(ports[0]), "--log-level", "warn"],
                           capture_output=True, text=True, timeout=120)
        check(p.returncode == 2 and f"--port: cannot listen on 127.0.0.1:{ports[0]}" in p.stderr,
              f"a second worker on a held port is refused ({p.stderr.strip()[-160:]!r})")
        remote_draft_checks(log, single, ps, ref)
        tls_checks(log)
        r = http("POST", single + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8,
                                                      "temperature": 0})
        hostile_checks(log, json.loads(r[1])["choices"][0]["text"])
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in PROCS:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
    print(f"cluster-e2e: all checks passed (log {log.name})", flush=True)
    os.unlink(log.name)
    shutil.rmtree(config_home, ignore_errors=True)


if __name__ == "__main__":
    main()
