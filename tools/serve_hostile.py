"""tools/serve_hostile.py — hostile clients against `specactor serve` (run by tools/serve-hostile).

Loopback only, bounded in count and time. Each check starts from what a careless or malicious client
does and states what the server must do instead of crashing, hanging, or being starved:
header floods, too many headers, slow headers and slow bodies (deadlines a trickle cannot extend),
300 slow clients while /health must answer within 1 s, bodies over the limit by Content-Length and
chunked, malformed lengths, a burst of connections, pipelining, a connection cap, a non-streamed
request whose client leaves, bad input that must never be a 500, SIGTERM during 32 streams (every
stream ends with its last chunk and [DONE]), a grace period that cuts streams (an error event, not a
success), a second signal. Prints peak server memory where it matters. Exits non-zero naming the
first failed check.

  python3 tools/serve_hostile.py [--sigterm-runs N] [--load STREAMS]
"""
import argparse
import atexit
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SPECACTOR_BIN", os.path.join(ROOT, "build", "specactor"))  # another build, for A/B
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what, flush=True)
    if not cond:
        raise SystemExit(f"serve-hostile: failed: {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *flags):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="specactor-hostile-", suffix=".log", delete=False)
        cmd = [BIN, "serve", "--model-path", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
               "--speculative-algorithm", "NONE", *flags]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"serve-hostile: the server exited with {self.proc.returncode}; log: {self.log.name}")
            try:
                if get(self.base + "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise SystemExit(f"serve-hostile: /health never answered 200; log: {self.log.name}")

    def alive(self):
        return self.proc.poll() is None

    def rss_mib(self, field="VmRSS:"):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self, expect_rc=0, what="SIGTERM: the server exits 0"):
        self.proc.send_signal(signal.SIGTERM)
        rc = wait_exit(self.proc, 120)
        self.log.close()
        check(rc == expect_rc, f"{what} (got {rc}; log: {self.log.name})")
        os.unlink(self.log.name)


def wait_exit(proc, timeout):
    """The exit status, or "hung" (and the process killed) after `timeout` seconds."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "hung"


def get(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url, body, timeout=120, content_type="application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def connect(port, timeout=10):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s


def read_all(s, limit=1 << 20):
    out = b""
    try:
        while len(out) < limit:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def status_of(raw):
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def closed_within(s, seconds):
    """True when the server ends the connection within `seconds` (EOF or reset)."""
    s.settimeout(seconds)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def health_latency(srv):
    t0 = time.time()
    st, _ = get(srv.base + "/health", timeout=5)
    return st, time.time() - t0


# --- the checks -------------------------------------------------------------------------------------------

def header_flood(srv):
    print("serve-hostile: header flood (10 connections, up to 400,000 headers each, never finished)", flush=True)
    base_rss = srv.rss_mib()
    results = []

    def flood():
        s = connect(srv.port)
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            line = b"X-Flood: aaaaaaaaaaaaaaaaaaaa\r\n" * 1000
            sent = 0
            for _ in range(400):
                s.sendall(line)
                sent += 1000
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
        raw = read_all(s)
        results.append((sent, status_of(raw)))
        s.close()

    threads = [threading.Thread(target=flood) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    check(srv.alive(), "header flood: the server is still running")
    check(len(results) == 10 and all(sent < 400000 for sent, _ in results),
          f"header flood: every connection is cut before its 400,000 headers are in (sent {[r[0] for r in results]})")
    statuses = {st for _, st in results}
    check(statuses <= {431, None}, f"header flood: answered 431 (or closed), never anything else (got {statuses})")
    peak = srv.rss_mib("VmHWM:")
    print(f"  info header flood: server memory {base_rss:.0f} MiB before, peak {peak:.0f} MiB", flush=True)
    check(peak - base_rss < 64, f"header flood: memory stays bounded (peak {peak:.0f} MiB, {base_rss:.0f} before)")
    check(health_latency(srv)[0] == 200, "header flood: /health answers 200 afterwards")


def too_many_headers(srv):
    print("serve-hostile: 150 short headers in one request", flush=True)
    s = connect(srv.port)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n")
    raw = read_all(s)
    s.close()
    check(status_of(raw) == 431 and b"header" in raw, f"150 header lines: 431 naming the headers (got {raw[:60]!r})")


def slow_clients(srv, header_timeout):
    n = 300
    print(f"serve-hostile: {n} slow clients, one header line every 2 s; /health meanwhile; "
          f"--header-timeout {header_timeout}", flush=True)
    socks, stop = [], threading.Event()
    for _ in range(n):
        s = connect(srv.port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    cut_at = {}

    def trickle():
        t0 = time.time()
        while not stop.is_set() and len(cut_at) < n:
            for i, s in enumerate(socks):
                if i in cut_at:
                    continue
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    cut_at[i] = time.time() - t0
            stop.wait(2)

    t = threading.Thread(target=trickle)
    t.start()
    lat = []
    t_end = time.time() + header_timeout - 1
    while time.time() < t_end:
        st, dt = health_latency(srv)
        lat.append((st, dt))
        time.sleep(0.2)
    check(all(st == 200 for st, _ in lat) and max(dt for _, dt in lat) < 1.0,
          f"{n} slow clients: /health answers 200 within 1 s every time ({len(lat)} tries, "
          f"slowest {max(dt for _, dt in lat) * 1000:.0f} ms)")
    # The trickle does not extend the deadline: every slow connection is closed soon after it.
    deadline = time.time() + header_timeout + 6
    closed = 0
    for s in socks:
        if closed_within(s, max(0.05, deadline - time.time())):
            closed += 1
    stop.set()
    t.join()
    for s in socks:
        s.close()
    check(closed == n, f"{n} slow clients: all closed by the header deadline although each kept sending "
                       f"({closed} closed)")
    check(srv.alive() and health_latency(srv)[0] == 200, "slow clients: the server answers afterwards")


def slow_body(srv, body_timeout):
    print(f"serve-hostile: a body sent 10 bytes a second (--body-timeout {body_timeout})", flush=True)
    s = connect(srv.port)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100000\r\n\r\n")
    t0 = time.time()
    cut = None
    while time.time() - t0 < body_timeout + 6:
        try:
            s.sendall(b"a" * 10)
        except OSError:
            cut = time.time() - t0
            break
        if closed_within(s, 1.0):
            cut = time.time() - t0
            break
    s.close()
    check(cut is not None and cut < body_timeout + 3,
          f"a trickled body is cut by the body deadline ({'never' if cut is None else f'{cut:.1f} s'})")


def bodies_over_limit(srv, limit):
    print(f"serve-hostile: bodies over --max-body-bytes {limit}", flush=True)
    t0 = time.time()
    s = connect(srv.port)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (limit * 20))
    raw = read_all(s)
    s.close()
    check(status_of(raw) == 413 and time.time() - t0 < 2,
          f"Content-Length over the limit: 413 before the body is sent (got {status_of(raw)} in {time.time() - t0:.1f} s)")
    for length in (b"-5", b"abc", b"99999999999999999999999"):
        t0 = time.time()
        s = connect(srv.port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + length + b"\r\n\r\n")
        raw = read_all(s)
        s.close()
        st = status_of(raw)
        check(st in (400, 413) and time.time() - t0 < 2,
              f"Content-Length {length.decode()}: 400/413 at once (got {st} in {time.time() - t0:.1f} s)")
    base = srv.rss_mib()
    for total in (limit * 20, limit * 200):
        t0 = time.time()
        s = connect(srv.port, timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * 65536
        sent = 0
        try:
            while sent < total:
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
            s.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        raw = read_all(s)
        s.close()
        st = status_of(raw)
        check(st == 413, f"a chunked body of {total >> 20} MiB: 413 (got {st} after {time.time() - t0:.1f} s)")
    peak = srv.rss_mib("VmHWM:")
    print(f"  info chunked bodies: server memory {base:.0f} MiB before, peak {peak:.0f} MiB", flush=True)
    check(srv.alive(), "bodies over the limit: the server is still running")


def burst(srv, n=300):
    print(f"serve-hostile: a burst of {n} connections at once", flush=True)
    socks = []
    for _ in range(n):
        socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=30))
    for s in socks:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    ok = 0
    for s in socks:
        if status_of(read_all(s)) == 200:
            ok += 1
        s.close()
    check(ok == n, f"a burst of {n} connections: every one answered 200 ({ok})")


def pipelining(srv):
    print("serve-hostile: three pipelined requests in one write", flush=True)
    s = connect(srv.port)
    body = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
              b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    raw = read_all(s)
    s.close()
    starts = [i for i in range(len(raw)) if raw.startswith(b"HTTP/1.1 ", i)]
    statuses = [status_of(raw[i:]) for i in starts]
    check(statuses == [200, 200, 200] and b"text_completion" in raw and raw.rfind(b"\"object\":\"list\"") > raw.find(
        b"text_completion"), f"pipelining: three answers in order (got {statuses})")


def connection_cap(port_flags):
    print("serve-hostile: --max-connections 20 with 25 idle connections open; --max-running-requests 100000",
          flush=True)
    srv = Server("--max-connections", "20", "--max-running-requests", "100000", *port_flags)
    st, _ = post(srv.base + "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    threads = int(srv.rss_mib("Threads:") * 1024)
    check(st == 200 and threads < 64, f"--max-running-requests 100000: served, with {threads} threads in all")
    idle = [connect(srv.port) for _ in range(25)]
    time.sleep(0.3)
    s = connect(srv.port)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = read_all(s)
    s.close()
    check(status_of(raw) == 503 and b"Retry-After" in raw and b"max-connections" in raw,
          f"over the connection cap: 503 + Retry-After naming --max-connections (got {raw[:80]!r})")
    for c in idle:
        c.close()
    time.sleep(0.5)
    check(get(srv.base + "/health")[0] == 200, "the connection cap: once they close, /health is 200 again")
    srv.stop()


def metrics(srv):
    out = {}
    for line in get(srv.base + "/metrics")[1].splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def non_streamed_disconnect(srv):
    print("serve-hostile: a non-streamed request whose client leaves", flush=True)
    before = metrics(srv).get("specactor:client_disconnects_total", 0)
    s = connect(srv.port)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    time.sleep(0.5)
    s.close()
    deadline, m = time.time() + 10, {}
    while time.time() < deadline:
        m = metrics(srv)
        if m["specactor:num_requests_running"] == 0 and m["specactor:kv_pages_used"] == 0:
            break
        time.sleep(0.1)
    check(m.get("specactor:num_requests_running") == 0 and m.get("specactor:kv_pages_used") == 0 and
          m.get("specactor:client_disconnects_total", 0) > before,
          "a non-streamed request whose client left is cancelled (no request running, no KV pages, counted)")
    gen = m.get("specactor:generation_tokens_total", 0)
    check(gen < 4000, f"... long before its 4,000 tokens ({gen:.0f} generated in all)")


def never_500(srv):
    print("serve-hostile: bad input is never a 500", flush=True)
    cases = [
        (b"GARBAGE\r\n\r\n", "a garbage request line"),
        (b"GET / HTTP/9.9\r\n\r\n", "an unknown HTTP version"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         "Content-Length and chunked together"),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "a bad chunk size"),
        (b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\n\r\n", "a 40 kB URL"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"\xff\xfe" * 100 + b"\r\n\r\n", "raw bytes in a header"),
    ]
    for raw, what in cases:
        s = connect(srv.port)
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out = read_all(s)
        s.close()
        st = status_of(out)
        # 505 is HTTP's own answer to a version it does not speak; every other 5xx would be the server's fault.
        check(st is None or st < 500 or (st == 505 and b"HTTP/9" in raw), f"{what}: not a server error (got {st})")
    bodies = [b"{", b"[]", b"\xff\xfe", json.dumps({"prompt": "x" * 100, "max_tokens": 2 ** 63 - 1}).encode(),
              json.dumps({"prompt": "hi", "temperature": 1e-40}).encode(),
              json.dumps({"prompt": "hi", "max_tokens": -1}).encode(),
              json.dumps({"prompt": [2 ** 40]}).encode(),
              json.dumps({"prompt": "hi", "logit_bias": {"one": 5}}).encode(),
              json.dumps({"prompt": "hi", "logit_bias": {"1": 1e300}}).encode(),
              b'{"prompt": "' + b"\\ud800" + b'"}', b"[" * 100000 + b"]" * 100000]
    for b in bodies:
        st, out = post(srv.base + "/v1/completions", b)
        check(400 <= st < 500 and len(out) < 4096, f"body {b[:40]!r}: a bounded 4xx (got {st}, {len(out)} bytes)")
    st, _ = post(srv.base + "/v1/completions", {"prompt": "hi"}, content_type="text/plain")
    check(st == 415, f"Content-Type text/plain: 415 (got {st})")
    check(srv.alive(), "bad input: the server is still running")


def stream_chat(base, max_tokens, events, i, start_barrier=None, ignore_eos=False):
    """One streamed chat over a raw socket; appends (i, status, finished, done, error) to events."""
    body = json.dumps({"messages": [{"role": "user", "content": "Write one sentence about the sea, number %d." % i}],
                       "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": ignore_eos}).encode()
    port = int(base.rsplit(":", 1)[1])
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=120)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        raw = b""
        first = None
        while True:
            b = s.recv(65536)
            if not b:
                break
            raw += b
            if first is None and b"data: " in raw:
                first = time.time()
                if start_barrier is not None:
                    start_barrier.set()
        s.close()
    except OSError as e:
        events.append((i, None, False, False, str(e)))
        return
    head, _, payload = raw.partition(b"\r\n\r\n")
    st = status_of(head)
    # de-chunk
    text = b""
    rest = payload
    while rest:
        line, _, rest = rest.partition(b"\r\n")
        try:
            n = int(line.split(b";")[0], 16)
        except ValueError:
            break
        if n == 0:
            break
        text += rest[:n]
        rest = rest[n + 2:]
    datas = [e[6:] for e in text.decode(errors="replace").split("\n\n") if e.startswith("data: ")]
    done = bool(datas) and datas[-1] == "[DONE]"
    finished, error = False, None
    for d in datas:
        if d == "[DONE]":
            continue
        try:
            j = json.loads(d)
        except ValueError:
            continue
        if "error" in j:
            error = j["error"].get("message", "error")
        for c in j.get("choices", []):
            if c.get("finish_reason"):
                finished = True
    events.append((i, st, finished, done, error))


def sigterm_during_streams(runs, streams=32):
    print(f"serve-hostile: SIGTERM during {streams} streams, {runs} run(s)", flush=True)
    truncated = 0
    for run in range(runs):
        srv = Server("--max-running-requests", str(streams))
        events, started = [], threading.Event()
        # Short and longer answers, and the signal at a random moment: some streams are finishing
        # just as it arrives (where a drain that only waits for the engine cuts the last chunk).
        threads = [threading.Thread(target=stream_chat, args=(srv.base, random.choice((4, 8, 24)), events, i, started))
                   for i in range(streams)]
        for t in threads:
            t.start()
        started.wait(60)
        time.sleep(random.uniform(0, 1.0))
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=120)
        rc = srv.proc.wait(timeout=120)
        srv.log.close()
        bad = [e for e in events if not (e[1] == 200 and e[2] and e[3] and e[4] is None)]
        # A stream the drain refused outright (503 before it began) is allowed; a 200 that stops early is not.
        bad = [e for e in bad if not (e[1] == 503)]
        if bad or len(events) != streams or rc != 0:
            truncated += 1
            print(f"  run {run}: rc {rc}, {len(events)} streams, not whole: {bad[:3]} (log {srv.log.name})", flush=True)
        else:
            os.unlink(srv.log.name)
    check(truncated == 0, f"SIGTERM during {streams} streams: every stream ended with its last chunk and [DONE], "
                          f"the server exited 0 ({runs} runs, {truncated} bad)")


def grace_cut():
    print("serve-hostile: --grace-period 0.5 cuts long streams and requests", flush=True)
    srv = Server("--grace-period", "0.5")
    events, started = [], threading.Event()
    threads = [threading.Thread(target=stream_chat, args=(srv.base, 3000, events, i, started, True)) for i in range(4)]
    whole = {}

    def non_streamed():
        whole["r"] = post(srv.base + "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3000,
                                                         "ignore_eos": True})

    tn = threading.Thread(target=non_streamed)
    for t in threads:
        t.start()
    tn.start()
    started.wait(60)
    time.sleep(0.3)
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    for t in threads + [tn]:
        t.join(timeout=60)
    rc = srv.proc.wait(timeout=60)
    check(rc == 0 and time.time() - t0 < 15, f"grace cut: the server exits 0 soon after the grace period "
                                             f"(rc {rc}, {time.time() - t0:.1f} s)")
    check(len(events) == 4 and all(e[1] == 200 and e[4] is not None and "grace" in e[4] for e in events),
          f"grace cut: each cut stream ends with an error event naming the grace period ({events})")
    st, out = whole.get("r", (None, ""))
    check(st == 503 and "grace" in out, f"grace cut: a cut non-streamed request is a 503, not a 200 (got {st})")
    srv.log.close()
    os.unlink(srv.log.name)


def second_signal():
    print("serve-hostile: a second SIGINT stops at once", flush=True)
    srv = Server("--grace-period", "300")
    events, started = [], threading.Event()
    threads = [threading.Thread(target=stream_chat, args=(srv.base, 3000, events, i, started, True)) for i in range(2)]
    for t in threads:
        t.start()
    started.wait(60)
    srv.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    check(srv.alive(), "second signal: after the first the server drains (still running)")
    t0 = time.time()
    srv.proc.send_signal(signal.SIGINT)
    rc = wait_exit(srv.proc, 10)
    check(rc == 128 + signal.SIGINT and time.time() - t0 < 5,
          f"second signal: exits {128 + signal.SIGINT} within 5 s (got {rc} in {time.time() - t0:.1f} s)")
    for t in threads:
        t.join(timeout=30)
    srv.log.close()
    os.unlink(srv.log.name)


def signal_while_starting():
    print("serve-hostile: SIGTERM / SIGINT while the server loads, and while a front waits for its workers", flush=True)
    for what, flags, sig in (("loading the model", ["--model-path", MODEL], signal.SIGINT),
                             ("a front waiting 60 s for a worker that is not there",
                              ["--model-path", MODEL, "--workers", f"127.0.0.1:{free_port()}", "--workers-wait", "60",
                               "--worker-secret-file", "none"],
                              signal.SIGTERM)):
        port = free_port()
        log = tempfile.NamedTemporaryFile(prefix="specactor-hostile-", suffix=".log", delete=False)
        proc = subprocess.Popen([BIN, "serve", "--host", "127.0.0.1", "--port", str(port), *flags],
                                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline and proc.poll() is None:  # the listener is up before the load starts
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.02)
        if what.startswith("a front"):
            time.sleep(1.0)  # well inside the wait
        t0 = time.time()
        proc.send_signal(sig)
        rc = wait_exit(proc, 10)
        log.close()
        text = open(log.name).read()
        # Loading the small default model can finish before the signal lands: then it is the usual drain.
        expect = 0 if "ready:" in text and "during" not in text else 128 + sig
        check(rc == expect and time.time() - t0 < 5,
              f"{signal.Signals(sig).name} while {what}: exits {expect} within 5 s (got {rc} in {time.time() - t0:.1f} s)")
        os.unlink(log.name)


def prefix_cache():
    print("serve-hostile: the prefix cache through the server (a second turn, /metrics, /flush_cache)", flush=True)
    srv = Server()
    msgs = [{"role": "user", "content": "Explain in three sentences how a bicycle gear works."}]
    st, out = post(srv.base + "/v1/chat/completions", {"messages": msgs, "max_tokens": 40, "temperature": 0})
    r1 = json.loads(out)
    msgs += [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And why do racing bikes have so many gears?"}]
    st2, out2 = post(srv.base + "/v1/chat/completions", {"messages": msgs, "max_tokens": 16, "temperature": 0})
    u = json.loads(out2)["usage"]
    cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    check(st == 200 and st2 == 200 and cached >= 32 and cached < u["prompt_tokens"],
          f"the second turn reports cached prompt tokens ({cached} of {u['prompt_tokens']})")
    m = metrics(srv)
    check(m.get("specactor:prefix_cache_enabled") == 1 and m.get("specactor:prefix_cache_hits_total", 0) >= cached
          and m.get("specactor:prefix_cache_pages", 0) > 0 and m.get("specactor:kv_pages_used") == 0,
          "/metrics: the cache is on, counts the hit, holds pages; no pages reserved by requests")
    st, out = post(srv.base + "/flush_cache", {})
    m = metrics(srv)
    check(st == 200 and json.loads(out).get("flushed_pages", 0) > 0 and m.get("specactor:prefix_cache_pages") == 0,
          f"POST /flush_cache gives every cached page back ({out.strip()})")
    srv.stop()

    print("serve-hostile: 64 streams with shared prefixes through a 2,048-token KV budget", flush=True)
    srv = Server("--max-total-tokens", "2048", "--max-queued-requests", "64")
    events = []
    lock = threading.Lock()

    def one(i):
        system = "You answer in one short sentence. " * (4 + i % 4)  # four shared system prompts
        body = {"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": f"Name a colour, number {i}."}],
                "max_tokens": 24, "temperature": 0}
        st, out = post(srv.base + "/v1/chat/completions", body, timeout=600)
        with lock:
            events.append((st, json.loads(out).get("usage", {}) if st == 200 else out[:200]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    ok = [e for e in events if e[0] == 200]
    hits = sum(e[1].get("prompt_tokens_details", {}).get("cached_tokens", 0) for e in ok)
    m = metrics(srv)
    check(len(ok) == 64, f"64 streams under a small KV budget: every one finished ({len(ok)}; "
                         f"others: {[e for e in events if e[0] != 200][:2]})")
    check(hits > 0 and m.get("specactor:prefix_cache_evicted_pages_total", 0) > 0,
          f"... with cache hits ({hits} tokens) and evictions counted "
          f"({m.get('specactor:prefix_cache_evicted_pages_total', 0):.0f} pages)")
    post(srv.base + "/flush_cache", {})
    m = metrics(srv)
    check(m.get("specactor:kv_pages_used") == 0 and m.get("specactor:prefix_cache_pages") == 0,
          "after a flush no page is held: the pool is whole again")
    srv.stop()


def load(n):
    print(f"serve-hostile: {n} concurrent streams", flush=True)
    # The default batch (--max-running-requests 32): the rest wait in the queue, so aggregate tok/s
    # compares like for like across stream counts.
    srv = Server("--max-queued-requests", str(n))
    events, ttft = [], {}
    lock = threading.Lock()
    body_for = lambda i: json.dumps({"messages": [{"role": "user", "content": "Write one sentence about the sea, "
                                                                              "number %d." % i}],
                                     "max_tokens": 32, "temperature": 0, "stream": True,
                                     "stream_options": {"include_usage": True}}).encode()

    def one(i):
        t0 = time.time()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=600)
        b = body_for(i)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(b) + b)
        raw, first = b"", None
        while True:
            x = s.recv(65536)
            if not x:
                break
            raw += x
            if first is None and b'"content"' in raw:
                first = time.time() - t0
        s.close()
        i_usage = raw.rfind(b'"completion_tokens":')
        tokens = int(raw[i_usage + 20:].split(b",")[0].split(b"}")[0]) if i_usage >= 0 else 0
        with lock:
            events.append((raw.rstrip().endswith(b"0") and b"data: [DONE]" in raw, tokens))
            ttft[i] = first

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    wall = time.time() - t0
    done = sum(1 for ok, _ in events if ok)
    tokens = sum(t for _, t in events)
    firsts = sorted(v for v in ttft.values() if v is not None)
    p50 = firsts[len(firsts) // 2] if firsts else float("nan")
    p99 = firsts[min(len(firsts) - 1, int(0.99 * len(firsts)))] if firsts else float("nan")
    peak = srv.rss_mib("VmHWM:")
    print(f"  info {n} concurrent streams: {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tok/s aggregate; "
          f"TTFT p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; server peak memory {peak:.0f} MiB", flush=True)
    check(done == n, f"{n} concurrent streams: every stream completes with [DONE] ({done})")
    srv.stop()


def main():
    # The engines started here keep what the budget learns under $XDG_CACHE_HOME: this run's own folder,
    # not the user's (a run must neither read nor change the user's budget memory).
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="specactor-serve-hostile-cache-")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--sigterm-runs", type=int, default=5)
    ap.add_argument("--load", type=int, default=0, help="also run this many concurrent streams and report")
    ap.add_argument("--only", default="", help="comma-separated: basic, cap, sigterm, grace, second, starting, cache, load")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    want = lambda name: not only or name in only

    if want("basic"):
        srv = Server("--header-timeout", "4", "--body-timeout", "4", "--max-body-bytes", "1048576")
        header_flood(srv)
        too_many_headers(srv)
        slow_clients(srv, 4)
        slow_body(srv, 4)
        bodies_over_limit(srv, 1048576)
        burst(srv)
        pipelining(srv)
        non_streamed_disconnect(srv)
        never_500(srv)
        srv.stop()
    if want("cap"):
        connection_cap(())
    if want("sigterm"):
        sigterm_during_streams(args.sigterm_runs)
    if want("grace"):
        grace_cut()
    if want("second"):
        second_signal()
    if want("starting"):
        signal_while_starting()
    if want("cache"):
        prefix_cache()
    if args.load and want("load"):
        load(args.load)
    print("serve-hostile: every check passed", flush=True)


if __name__ == "__main__":
    main()
