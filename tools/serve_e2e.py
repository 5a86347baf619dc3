"""tools/serve_e2e.py — end-to-end checks of `specactor serve` (run by tools/serve-e2e).

Starts the server on free loopback ports with the default model (plain, then NGRAM), waits for
/health, and drives it with the real `openai` client and with curl: chat and completions, streaming
and not, greedy outputs equal to `specactor generate`'s, the error cases, 64 concurrent streams, a
client killed mid-stream, an API key, a full queue, SIGTERM with a request in flight; structured output
(50 JSON Schemas whose answers must validate with `jsonschema`, refused keywords, json_object) and tool
calls (required, named, auto; whole and streamed; arguments valid for the declared parameters). Prints a load
summary of the 64 streams (aggregate tok/s, TTFT p50/p99, the server's peak memory). Exits non-zero
on the first failed check, naming it.
"""
import atexit
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import jsonschema
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import structured_schemas  # noqa: E402  (tools/structured_schemas.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "specactor")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
NAME = os.path.basename(MODEL)
CHAT_PROMPTS = ["What is the capital of France?", "Name three colors.", "Write one sentence about the sea."]
TEXT_PROMPTS = ["The capital of France is", "Once upon a time, in a small village,"]
FAILED = []


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what, flush=True)
    if not cond:
        FAILED.append(what)
        raise SystemExit(f"serve-e2e: failed: {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and not req.has_header("Content-type"):
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def metrics(base):
    _, _, text = http("GET", base + "/metrics")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


class Server:
    def __init__(self, *flags):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="specactor-serve-", suffix=".log", delete=False)
        cmd = [BIN, "serve", "--model-path", MODEL, "--host", "127.0.0.1", "--port", str(self.port), *flags]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline, seen = time.time() + 180, []
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"serve-e2e: the server exited with {self.proc.returncode}; log: {self.log.name}")
            try:
                status, _, _ = http("GET", self.base + "/health")
                seen.append(status)
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.01)
        else:
            raise SystemExit(f"serve-e2e: /health never answered 200; log: {self.log.name}")
        check(all(s == 503 for s in seen[:-1]),
              f"/health answers 503 while the model loads, then 200 ({seen.count(503)} x 503 seen)")
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=300)

    def peak_rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self, expect_rc=0):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=120)
        self.log.close()
        check(rc == expect_rc, f"SIGTERM: the server exits with {expect_rc} (got {rc}; log: {self.log.name})")
        os.unlink(self.log.name)  # kept only when something failed


def generate_cli(prompt, chat, max_new, extra=()):
    cmd = [BIN, "generate", "--model-path", MODEL, "--log-level", "warn", "--prompt", prompt,
           "--max-new-tokens", str(max_new), "--json", *extra]
    if chat:
        cmd.append("--chat")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["text"]


def chat(srv, prompt, max_tokens=32, **kw):
    return srv.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}],
                                              max_tokens=max_tokens, temperature=0, **kw)


def chat_stream(srv, prompt, max_tokens=32):
    text, usage, first = "", None, None
    t0 = time.time()
    stream = srv.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=max_tokens, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                if first is None:
                    first = time.time() - t0
                text += c.delta.content
    return text, usage, first


def outputs_match(srv, expected_chat, expected_text, label):
    for p in CHAT_PROMPTS:
        r = chat(srv, p)
        check(r.choices[0].message.content == expected_chat[p], f"{label}: chat {p!r} equals specactor generate")
        check(r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, f"{label}: chat usage is filled")
        text, usage, _ = chat_stream(srv, p)
        check(text == expected_chat[p], f"{label}: streamed chat {p!r} equals specactor generate")
        check(usage is not None and usage.completion_tokens == r.usage.completion_tokens,
              f"{label}: stream_options.include_usage sends the usage")
    for p in TEXT_PROMPTS:
        r = srv.client.completions.create(model=NAME, prompt=p, max_tokens=32, temperature=0)
        check(r.choices[0].text == expected_text[p], f"{label}: completion {p!r} equals specactor generate")
        streamed = "".join(c.choices[0].text for c in srv.client.completions.create(
            model=NAME, prompt=p, max_tokens=32, temperature=0, stream=True) if c.choices)
        check(streamed == expected_text[p], f"{label}: streamed completion {p!r} equals specactor generate")


def rules_and_logprobs(srv, label):
    """Penalties, logit_bias, min_tokens, logprobs and seed through the openai client: the speculative
    answers equal `"speculative": false` ones (text and log probabilities), streamed and not."""
    msgs = [{"role": "user", "content": "List five colours, one per line."}]
    kw = dict(model=NAME, messages=msgs, max_tokens=24, temperature=0, logprobs=True, top_logprobs=3,
              presence_penalty=0.6, frequency_penalty=0.3, logit_bias={"198": -5})
    extra = {"repetition_penalty": 1.15, "min_tokens": 4}

    def lp_of(content):
        return [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs]) for c in content]

    spec = srv.client.chat.completions.create(**kw, extra_body=extra)
    plain = srv.client.chat.completions.create(**kw, extra_body={**extra, "speculative": False})
    check(spec.choices[0].message.content == plain.choices[0].message.content,
          f"{label}: penalties and a bias, speculative text equals plain")
    a, b = lp_of(spec.choices[0].logprobs.content), lp_of(plain.choices[0].logprobs.content)
    check(len(a) == spec.usage.completion_tokens and a == b and all(len(t) == 3 for _, _, t in a),
          f"{label}: chat logprobs (3 alternatives) equal with and without speculation ({len(a)} tokens)")
    streamed = []
    for chunk in srv.client.chat.completions.create(**kw, extra_body=extra, stream=True):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed += lp_of(c.logprobs.content)
    check(streamed == a, f"{label}: streamed chat logprobs equal the whole answer's")
    ck = dict(model=NAME, prompt="The three primary colours are", max_tokens=16, temperature=0, logprobs=2)
    cs = srv.client.completions.create(**ck)
    cp = srv.client.completions.create(**ck, extra_body={"speculative": False})
    check(cs.choices[0].text == cp.choices[0].text and
          cs.choices[0].logprobs.token_logprobs == cp.choices[0].logprobs.token_logprobs and
          cs.choices[0].logprobs.top_logprobs == cp.choices[0].logprobs.top_logprobs,
          f"{label}: completions logprobs equal with and without speculation")
    sk = dict(model=NAME, messages=msgs, max_tokens=24, temperature=0.8, seed=1234)
    s1 = srv.client.chat.completions.create(**sk).choices[0].message.content
    s2 = srv.client.chat.completions.create(**sk).choices[0].message.content
    s3 = srv.client.chat.completions.create(**sk, extra_body={"speculative": False}).choices[0].message.content
    check(s1 == s2 == s3, f"{label}: seeded sampling gives the same text twice and without speculation")


def structured(srv, label, compare_plain=False):
    """response_format and tools through the openai client: every answer parses and validates."""
    for i, (name, prompt, schema) in enumerate(structured_schemas.SCHEMAS):
        rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        msgs = [{"role": "user", "content": prompt + " Answer in JSON."}]
        if i % 10 == 9:  # streamed
            text, finish = "", None
            for chunk in srv.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=300, temperature=0,
                                                             response_format=rf, stream=True):
                for c in chunk.choices:
                    text += c.delta.content or ""
                    finish = c.finish_reason or finish
        else:
            r = srv.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=300, temperature=0,
                                                   response_format=rf)
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        try:
            jsonschema.validate(json.loads(text), schema)
            ok = finish == "stop"
        except (ValueError, jsonschema.ValidationError) as e:
            ok = False
            print(f"  {name}: {e}", flush=True)
        check(ok, f"{label}: schema {name}: the answer parses and validates ({finish}: {text[:80]!r})")
        if compare_plain and i % 5 == 0:
            p = srv.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=300, temperature=0,
                                                   response_format=rf, extra_body={"speculative": False})
            check(p.choices[0].message.content == text, f"{label}: schema {name}: speculative equals plain")
    for schema, keyword in structured_schemas.UNSUPPORTED:
        st, _, out = http("POST", srv.base + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": schema}}})
        err = json.loads(out).get("error", {})
        check(st == 400 and err.get("param") == "response_format" and keyword in err.get("message", ""),
              f"{label}: a schema with {keyword} is a 400 naming it (got {st}: {err.get('message')})")
    deep = {}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    t0 = time.time()
    st, _, out = http("POST", srv.base + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": deep}}})
    check(st == 400 and time.time() - t0 < 5, f"{label}: a schema nested 200 deep is a 400 at once (got {st})")
    r = srv.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "List three fruits."}],
                                           max_tokens=100, temperature=0, response_format={"type": "json_object"})
    try:
        ok = isinstance(json.loads(r.choices[0].message.content), dict)
    except ValueError:
        ok = False
    check(ok or r.choices[0].finish_reason == "length", f"{label}: json_object answers a JSON object")

    tools = structured_schemas.TOOLS
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}

    def valid_calls(calls, only=None):
        if not calls:
            return False
        for c in calls:
            if c.function.name not in params or (only and c.function.name != only):
                return False
            try:
                jsonschema.validate(json.loads(c.function.arguments), params[c.function.name])
            except (ValueError, jsonschema.ValidationError):
                return False
        return True

    msgs = [{"role": "user", "content": "What is the weather in Oslo, in celsius?"}]
    r = srv.client.chat.completions.create(model=NAME, messages=msgs, tools=tools, tool_choice="required",
                                           max_tokens=200, temperature=0)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls" and valid_calls(c.message.tool_calls),
          f"{label}: tool_choice required: tool_calls whose arguments validate ({c.message.tool_calls})")
    r = srv.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "What is 2 plus 40?"}],
                                           tools=tools, max_tokens=200, temperature=0, parallel_tool_calls=False,
                                           tool_choice={"type": "function", "function": {"name": "add"}})
    c = r.choices[0]
    check(valid_calls(c.message.tool_calls, "add") and len(c.message.tool_calls) == 1,
          f"{label}: a named function, one call: add with valid arguments ({c.message.tool_calls})")
    streamed = {}
    finish = None
    for chunk in srv.client.chat.completions.create(model=NAME, messages=msgs, tools=tools, tool_choice="required",
                                                     max_tokens=200, temperature=0, stream=True):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                streamed.setdefault(tc.index, tc)
    check(finish == "tool_calls" and [streamed[k].function.name for k in sorted(streamed)] ==
          [t.function.name for t in r.choices[0].message.tool_calls] or valid_calls(list(streamed.values())),
          f"{label}: streamed tool calls arrive whole with valid arguments")
    r = srv.client.chat.completions.create(model=NAME, messages=msgs, tools=tools, max_tokens=200, temperature=0)
    c = r.choices[0]
    check(c.message.tool_calls is None or valid_calls(c.message.tool_calls),
          f"{label}: tool_choice auto: an answer, or calls with valid arguments")
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12 degrees, light rain"}]
    r = srv.client.chat.completions.create(model=NAME, messages=follow, tools=tools, tool_choice="none",
                                           max_tokens=40, temperature=0)
    check(r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length"),
          f"{label}: a tool result in the conversation, tool_choice none: a plain answer")


def choices(srv, label):
    """n > 1 through the openai client: n choices in order, reproducible with a seed, streamed too."""
    kw = dict(model=NAME, messages=[{"role": "user", "content": "Name an animal."}], max_tokens=12, temperature=0.9,
              seed=77, n=3)
    a = srv.client.chat.completions.create(**kw)
    b = srv.client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    check([c.index for c in a.choices] == [0, 1, 2] and texts == [c.message.content for c in b.choices],
          f"{label}: n=3 with a seed: three choices in order, the same twice ({texts})")
    check(len(set(texts)) > 1, f"{label}: n=3 sampled: the choices differ ({texts})")
    check(a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens, f"{label}: n=3 usage adds up")
    streamed = {}
    for chunk in srv.client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    check([streamed.get(i) for i in range(3)] == texts, f"{label}: n=3 streamed: each index's text equals the whole answer's")
    p = srv.client.chat.completions.create(**kw, extra_body={"speculative": False})
    check([c.message.content for c in p.choices] == texts, f"{label}: n=3 seeded: the same without speculation")


def main():
    # The engines started here keep what the budget learns under $XDG_CACHE_HOME: this run's own folder,
    # not the user's (a run must neither read nor change the user's budget memory).
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="specactor-serve-e2e-cache-")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)
    if not os.path.exists(MODEL):
        raise SystemExit("serve-e2e: the default model is missing (run tools/setup)")
    print("serve-e2e: expected outputs from specactor generate", flush=True)
    expected_chat = {p: generate_cli(p, True, 32) for p in CHAT_PROMPTS}
    expected_text = {p: generate_cli(p, False, 32) for p in TEXT_PROMPTS}

    print("serve-e2e: plain server", flush=True)
    srv = Server("--max-body-bytes", "65536")
    b = srv.base
    outputs_match(srv, expected_chat, expected_text, "plain")
    structured(srv, "plain")
    choices(srv, "plain")
    models = srv.client.models.list()
    check([m.id for m in models.data] == [NAME], "GET /v1/models lists the served model")

    # curl: the same requests as any HTTP client sends them.
    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": CHAT_PROMPTS[0]}], "max_tokens": 32})
    out = subprocess.run(["curl", "-sS", b + "/v1/chat/completions", "-H", "Content-Type: application/json",
                          "-d", body], check=True, capture_output=True, text=True).stdout
    check(json.loads(out)["choices"][0]["message"]["content"] == expected_chat[CHAT_PROMPTS[0]], "curl: chat")
    # Without the header curl says application/x-www-form-urlencoded, the type a web page may POST
    # without a CORS preflight: refused (415) with the fix in the message.
    st, _, out = http("POST", b + "/v1/completions", headers={"Content-Type": "application/x-www-form-urlencoded"},
                      raw=json.dumps({"prompt": "hi", "max_tokens": 2}).encode())
    check(st == 415 and "Content-Type: application/json" in json.loads(out)["error"]["message"],
          f"a form-encoded POST (curl -d without -H): 415 saying which header to add (got {st})")
    sse = subprocess.run(["curl", "-sSN", b + "/v1/completions", "-H", "Content-Type: application/json", "-d",
                          json.dumps({"prompt": TEXT_PROMPTS[0], "max_tokens": 32, "stream": True})],
                         check=True, capture_output=True, text=True).stdout
    events = [e for e in sse.split("\n\n") if e]
    check(all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]",
          "curl: SSE events are `data: ...` and end with [DONE]")
    check("".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]) == expected_text[TEXT_PROMPTS[0]],
          "curl: streamed completion text")
    st, _, out = http("POST", b + "/generate", {"text": TEXT_PROMPTS[0], "sampling_params": {"max_new_tokens": 32}})
    g = json.loads(out)
    check(st == 200 and g["text"] == expected_text[TEXT_PROMPTS[0]] and g["meta_info"]["completion_tokens"] > 0,
          "POST /generate (sglang form)")
    st, _, out = http("POST", b + "/tokenize", {"prompt": "hello world"})
    ids = json.loads(out)["tokens"]
    st2, _, out2 = http("POST", b + "/detokenize", {"tokens": ids})
    check(st == 200 and st2 == 200 and json.loads(out2)["prompt"] == "hello world", "tokenize / detokenize round trip")
    st, _, out = http("GET", b + "/server_info")
    info = json.loads(out)
    check(st == 200 and info["target_hash_before_draft"] == info["target_hash_after_draft"]
          and "settings" in info["target"], "GET /server_info shows the target snapshot and its hashes")

    # Errors: OpenAI-shaped, naming the field.
    def expect_error(status, body, param, what, raw=None, path="/v1/chat/completions"):
        st, _, out = http("POST", b + path, body, raw=raw)
        try:
            err = json.loads(out)["error"]
        except (ValueError, KeyError):
            err = {}
        check(st == status and (param is None or err.get("param") == param) and "message" in err,
              f"error {status}: {what}")

    msgs = [{"role": "user", "content": "hi"}]
    expect_error(400, None, None, "malformed JSON", raw=b"{not json")
    expect_error(400, {"model": NAME, "messages": msgs, "temperature": "hot"}, "temperature", "wrong type")
    expect_error(400, {"model": NAME, "messages": msgs, "max_tokens": 10 ** 6}, "max_tokens", "beyond the context")
    expect_error(400, {"model": NAME, "messages": msgs, "n": 17}, "n", "n = 17 (at most 16)")
    expect_error(400, {"model": NAME}, "messages", "no messages")
    expect_error(400, {"model": NAME, "prompt": "hi", "echo": True}, "echo", "echo (with the reason)",
                 path="/v1/completions")
    expect_error(400, {"model": NAME, "prompt": "hi", "suffix": "end"}, "suffix", "suffix (with the reason)",
                 path="/v1/completions")
    expect_error(400, {"model": NAME, "prompt": "hi", "n": 2, "best_of": 3}, "best_of", "best_of other than n",
                 path="/v1/completions")
    expect_error(404, {"model": "gpt-4", "messages": msgs}, "model", "unknown model")
    expect_error(413, None, None, "body over --max-body-bytes", raw=b"{" + b" " * 100000 + b"}")
    st, _, out = http("GET", b + "/no/such/route")
    check(st == 404 and "error" in json.loads(out), "error 404: unknown route")
    try:
        srv.client.chat.completions.create(model="gpt-4", messages=msgs)
        check(False, "openai client: unknown model raises NotFoundError")
    except openai.NotFoundError:
        check(True, "openai client: unknown model raises NotFoundError")

    # 64 concurrent streams: all complete with the right text; /metrics counts them.
    before = metrics(b)
    results, lock = [], threading.Lock()

    def one(i):
        p = CHAT_PROMPTS[i % len(CHAT_PROMPTS)]
        text, usage, ttft = chat_stream(srv, p)
        with lock:
            results.append((p, text, usage.completion_tokens if usage else 0, ttft))

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.time() - t0
    check(len(results) == 64, "64 concurrent streams all complete")
    check(all(text == expected_chat[p] for p, text, _, _ in results), "64 concurrent streams: greedy texts correct")
    after = metrics(b)
    served = after['specactor:requests_total{endpoint="chat"}'] - before['specactor:requests_total{endpoint="chat"}']
    check(served == 64, f"/metrics counts the 64 streams (got {served:.0f})")
    tokens = sum(n for _, _, n, _ in results)
    ttfts = sorted(t for _, _, _, t in results if t is not None)
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
    load = (f"64 concurrent streams: {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tok/s aggregate; "
            f"TTFT p50 {statistics.median(ttfts) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
            f"server peak memory {srv.peak_rss_mib():.0f} MiB")

    # A client killed mid-stream: its request is cancelled, the batch and the KV pages are freed.
    curl = subprocess.Popen(["curl", "-sSN", b + "/v1/completions", "-H", "Content-Type: application/json", "-d",
                             json.dumps({"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
                                         "stream": True})], stdout=subprocess.PIPE)
    curl.stdout.read(200)
    curl.kill()
    curl.wait()
    deadline, m = time.time() + 30, {}
    while time.time() < deadline:
        m = metrics(b)
        if m["specactor:num_requests_running"] == 0 and m["specactor:kv_pages_used"] == 0:
            break
        time.sleep(0.1)
    check(m.get("specactor:num_requests_running") == 0 and m.get("specactor:kv_pages_used") == 0,
          "a client killed mid-stream leaves no running request and no KV pages used")
    check(m.get("specactor:client_disconnects_total", 0) >= 1, "/metrics counts the disconnect")

    # SIGTERM with a request in flight: it finishes, then the server exits 0.
    done = {}

    def long_request():
        done["r"] = chat(srv, CHAT_PROMPTS[0], max_tokens=32)

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.2)
    srv.stop(0)
    t.join(timeout=60)
    check("r" in done and done["r"].choices[0].message.content == expected_chat[CHAT_PROMPTS[0]],
          "SIGTERM: the request in flight finishes with its full answer")

    print("serve-e2e: API key and a full queue", flush=True)
    key_srv = Server("--api-key", "sekret", "--max-running-requests", "1", "--max-queued-requests", "0")
    st, _, out = http("POST", key_srv.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    check(st == 401 and json.loads(out)["error"]["type"] == "authentication_error", "no API key: 401")
    auth = {"Authorization": "Bearer sekret"}
    st, _, _ = http("POST", key_srv.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2}, headers=auth)
    check(st == 200, "the right API key: 200")
    st, _, _ = http("GET", key_srv.base + "/health")
    check(st == 200, "/health needs no key")
    busy = threading.Thread(target=http, args=("POST", key_srv.base + "/v1/completions",
                                               {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True},
                                               auth))
    busy.start()
    time.sleep(0.5)
    st, headers, out = http("POST", key_srv.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2}, headers=auth)
    check(st == 503 and "Retry-After" in headers, "a full queue: 503 with Retry-After")
    busy.join(timeout=120)
    key_srv.stop(0)

    print("serve-e2e: one server per port; a request beyond the KV budget is a 400", flush=True)
    kv_srv = Server("--max-total-tokens", "256")
    second = subprocess.run([BIN, "serve", "--model-path", MODEL, "--host", "127.0.0.1", "--port", str(kv_srv.port)],
                            capture_output=True, text=True, timeout=120)
    check(second.returncode == 2 and "cannot listen there" in second.stderr,
          f"a second server on a held port exits 2 (got {second.returncode}: {second.stderr.strip()[-200:]})")
    st, _, out = http("POST", kv_srv.base + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    err = json.loads(out).get("error", {})
    check(st == 400 and err.get("param") == "max_tokens" and "KV cache" in err.get("message", ""),
          f"no max_tokens and a 256-token KV budget: 400 naming max_tokens and the budget (got {st}: {out[:200]})")
    st, _, out = http("POST", kv_srv.base + "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    check(st == 200, f"the same with max_tokens 8: 200 (got {st})")
    kv_srv.stop(0)

    # NGRAM with a fixed shape: every decode step drafts, so the speculative path is exercised for
    # certain (with the budget, whether a step drafts depends on this machine's measured costs).
    print("serve-e2e: NGRAM server, fixed shape (--speculative-adaptive false)", flush=True)
    spec = Server("--speculative-algorithm", "NGRAM", "--speculative-adaptive", "false")
    outputs_match(spec, expected_chat, expected_text, "NGRAM fixed")
    rules_and_logprobs(spec, "NGRAM fixed")
    r = spec.client.completions.create(model=NAME, prompt="1 2 3 4 5 1 2 3 4 5 1 2 3 4 5 1 2 3", max_tokens=24,
                                       temperature=0)
    sp = r.model_extra.get("speculative", {})
    check(sp.get("drafted", 0) > 0 and sp.get("budget_skipped_steps", -1) == 0,
          f"NGRAM fixed: the response reports drafted tokens and no budget skips ({sp})")
    m = metrics(spec.base)
    check(m.get("specactor:spec_decode_num_draft_tokens_total", 0) > 0, "NGRAM fixed: /metrics counts draft tokens")
    check(m.get("specactor:spec_budget_adaptive") == 0, "NGRAM fixed: /metrics says the shape is fixed (adaptive 0)")
    spec.stop(0)

    print("serve-e2e: NGRAM server, the budget decides (the default)", flush=True)
    spec = Server("--speculative-algorithm", "NGRAM")
    outputs_match(spec, expected_chat, expected_text, "NGRAM budget")
    rules_and_logprobs(spec, "NGRAM budget")
    structured(spec, "NGRAM budget", compare_plain=True)
    choices(spec, "NGRAM budget")
    r = spec.client.completions.create(model=NAME, prompt="1 2 3 4 5 1 2 3 4 5 1 2 3 4 5 1 2 3", max_tokens=24,
                                       temperature=0)
    sp = r.model_extra.get("speculative", {})
    check(sp.get("steps", 0) > 0 and "budget_skipped_steps" in sp,
          f"NGRAM budget: the response reports its steps and the budget's skips ({sp})")
    print(f"  info the budget on a repeating prompt here: drafted {sp.get('drafted')}, "
          f"skipped {sp.get('budget_skipped_steps')} of {sp.get('steps')} steps", flush=True)
    m = metrics(spec.base)
    check(m.get("specactor:spec_budget_adaptive") == 1, "NGRAM budget: /metrics says the budget decides (adaptive 1)")
    verified = sum(v for k, v in m.items() if k.startswith("specactor:spec_budget_verified_nodes_total{"))
    check(verified > 0, f"NGRAM budget: /metrics has the histogram of draft nodes verified per step (total {verified:.0f})")
    check(m.get("specactor:spec_budget_step_ms", 0) > 0, "NGRAM budget: /metrics has the cost model's step time")
    spec.stop(0)

    print("serve-e2e: " + load, flush=True)
    print("serve-e2e: every check passed", flush=True)


if __name__ == "__main__":
    main()
