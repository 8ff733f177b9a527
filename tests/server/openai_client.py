"""Drives pocketmoe-serve with the real `openai` Python client (tests/server.rs runs this).

Modes:
  real URL MODEL KEY   chat, completion, streaming, usage, logprobs, stop, errors against the
                       real engine (tiny synth model)
  load URL MODEL KEY   16 concurrent streaming requests with fixed seeds; each must equal the
                       same request run alone (batched = single)
  mock QWEN_URL HARMONY_URL
                       tool-call and reasoning shapes against scripted engines (Qwen3 and
                       harmony output formats), streamed and not

Exits non-zero (an AssertionError with the details) on the first mismatch.
"""
import sys
import threading
import time

import json
import urllib.error
import urllib.request
import openai
from openai import OpenAI

CTX = 256  # the --ctx tests/server.rs starts the real server with


def get(url, key=None):
    """GET with the standard library; returns (status, body text)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def read_metric(url, key, name):
    """A plain (unlabelled) sample of /metrics."""
    _, text = get(url.replace("/v1", "/metrics"), key)
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


def client(url, key="unused"):
    return OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def expect_status(status, fn, what, code=None):
    try:
        fn()
    except openai.APIStatusError as e:
        assert e.status_code == status, f"{what}: status {e.status_code}, wanted {status}: {e}"
        body = e.body if isinstance(e.body, dict) else {}
        assert body.get("message"), f"{what}: error without a message: {e.body!r}"
        if code is not None:
            assert body.get("code") == code, f"{what}: code {body.get('code')!r}, wanted {code!r}"
        return body
    raise AssertionError(f"{what}: no error, wanted {status}")


def stream_chat(c, model, **kw):
    """Streams a chat completion; returns (text, finish_reason, usage, chunks)."""
    text, finish, usage, chunks = "", None, None, []
    for ch in c.chat.completions.create(model=model, stream=True, **kw):
        chunks.append(ch)
        assert ch.object == "chat.completion.chunk"
        if ch.usage is not None:
            usage = ch.usage
        for choice in ch.choices:
            if choice.delta.content:
                text += choice.delta.content
            if choice.finish_reason:
                finish = choice.finish_reason
    return text, finish, usage, chunks


def real(url, model, key):
    c = client(url, key)
    models = c.models.list().data
    assert [m.id for m in models] == [model], models
    assert c.models.retrieve(model).id == model

    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something."},
    ]
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=12, seed=7, temperature=0)
    assert r.object == "chat.completion", r
    assert r.id.startswith("chatcmpl-")
    ch = r.choices[0]
    assert ch.message.role == "assistant"
    assert ch.finish_reason in ("stop", "length"), ch.finish_reason
    assert isinstance(ch.message.content, str)
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 12, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    if ch.finish_reason == "length":
        assert u.completion_tokens == 12

    # Greedy is deterministic; streaming gives the same text, and usage when asked.
    r2 = c.chat.completions.create(model=model, messages=msgs, max_tokens=12, seed=99, temperature=0)
    assert r2.choices[0].message.content == ch.message.content
    text, finish, usage, chunks = stream_chat(
        c, model, messages=msgs, max_tokens=12, temperature=0,
        stream_options={"include_usage": True},
    )
    assert text == ch.message.content, (text, ch.message.content)
    assert finish == ch.finish_reason
    assert chunks[0].choices[0].delta.role == "assistant"
    assert usage is not None and usage.completion_tokens == u.completion_tokens, usage
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    _, _, no_usage, _ = stream_chat(c, model, messages=msgs, max_tokens=3)
    assert no_usage is None

    # Content parts, max_completion_tokens, seeded sampling is reproducible.
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    a = c.chat.completions.create(model=model, messages=parts, max_completion_tokens=8, seed=3, temperature=1.0)
    b = c.chat.completions.create(model=model, messages=parts, max_completion_tokens=8, seed=3, temperature=1.0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens <= 8

    # Logprobs.
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens, lp
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        # greedy: the chosen token is the most likely one
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4, t

    # Completions, streamed and not.
    r = c.completions.create(model=model, prompt="Once upon a time", max_tokens=10, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 10
    s = "".join(
        ch.choices[0].text
        for ch in c.completions.create(model=model, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True)
        if ch.choices
    )
    assert s == r.choices[0].text, (s, r.choices[0].text)
    d = c.completions.create(model=model, prompt="Once upon a time", max_tokens=16)
    assert d.usage.completion_tokens <= 16  # OpenAI's default max_tokens for completions
    r = c.completions.create(model=model, prompt=[1, 2, 3], max_tokens=3, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    assert all(len(t) <= 2 for t in lp.top_logprobs)

    # A stop string taken from a greedy output cuts it there. Always checked: the first of a few
    # fixed prompts whose greedy output is long enough supplies the stop string (greedy decoding
    # is deterministic, so the same prompt is picked every run).
    for prompt in ("xyz", "hello", "abc def", "1 2 3", "the"):
        full = c.completions.create(model=model, prompt=prompt, max_tokens=20, temperature=0).choices[0].text
        if len(full) >= 6:
            break
    assert len(full) >= 6, f"no prompt gave a greedy output of 6+ characters: {full!r}"
    stop = full[3:6]
    cut = c.completions.create(model=model, prompt=prompt, max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)], (cut.choices[0].text, full, stop)
    s = "".join(
        ch.choices[0].text
        for ch in c.completions.create(model=model, prompt=prompt, max_tokens=20, temperature=0, stop=stop, stream=True)
        if ch.choices
    )
    assert s == cut.choices[0].text

    # Errors, each with OpenAI's shape and a message.
    # Any model name is accepted, as llama-server does (clients hard-code names); the answer
    # names the served model.
    foreign = c.chat.completions.create(model="gpt-3.5-turbo", messages=msgs, max_tokens=2, temperature=0)
    assert foreign.model == model, foreign.model
    expect_status(400, lambda: c.chat.completions.create(model=model, messages=msgs, n=2), "n=2")
    expect_status(400, lambda: c.chat.completions.create(model=model, messages=[]), "no messages")
    expect_status(400, lambda: c.chat.completions.create(model=model, messages=msgs, max_tokens=CTX + 1),
                  "max_tokens beyond context", "context_length_exceeded")
    expect_status(400, lambda: c.chat.completions.create(model=model, messages=msgs, max_tokens=CTX - 5),
                  "prompt + max_tokens beyond context", "context_length_exceeded")
    long = "lorem ipsum dolor sit amet " * 200
    body = expect_status(400, lambda: c.completions.create(model=model, prompt=long, max_tokens=1),
                         "prompt longer than context", "context_length_exceeded")
    # llama-server's shape of that error: its type, the prompt's length and the context.
    assert body.get("type") == "exceed_context_size_error", body
    assert body.get("n_prompt_tokens", 0) > body.get("n_ctx", 1), body
    body = expect_status(400, lambda: c.chat.completions.create(model=model, messages=msgs, temperature=-1), "temperature")
    assert body.get("param") == "temperature", body
    body = expect_status(400, lambda: c.chat.completions.create(model=model, messages=msgs, extra_body={"top_k": "many"}), "top_k type")
    assert "top_k" in body["message"], body
    expect_status(400, lambda: c.chat.completions.create(model=model, messages=[{"role": "wizard", "content": "x"}]), "role")
    expect_status(400, lambda: c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]), "image part")
    # JSON mode through the client: the output is an instance of the schema.
    yn = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=100,
                                  response_format={"type": "json_schema", "json_schema": {"name": "yn", "schema": yn}})
    assert isinstance(json.loads(r.choices[0].message.content)["ok"], bool), r
    expect_status(400, lambda: c.chat.completions.create(model=model, messages=msgs, response_format={"type": "xml"}), "response_format")
    # The Responses API through the client, a foreign model name, JSON and streamed.
    r = c.responses.create(model="gpt-4o-mini", input="Hi there", instructions="Be brief.",
                           max_output_tokens=3, temperature=0)
    assert r.object == "response" and r.model == model, r
    assert r.usage.output_tokens <= 3 and r.usage.input_tokens > 0, r.usage
    text = r.output_text
    deltas, last = [], None
    for ev in c.responses.create(model="gpt-4o-mini", input="Hi there", instructions="Be brief.",
                                 max_output_tokens=3, temperature=0, stream=True):
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        last = ev
    assert "".join(deltas) == text, (deltas, text)
    assert last.type in ("response.completed", "response.incomplete"), last
    assert last.response.output_text == text, last

    # Several prompts: one choice each (llama-server), in order.
    two = c.completions.create(model=model, prompt=["a", "b"], max_tokens=2, temperature=0)
    assert [ch.index for ch in two.choices] == [0, 1], two
    by_index = {0: "", 1: ""}
    for ch in c.completions.create(model=model, prompt=["a", "b"], max_tokens=2, temperature=0, stream=True):
        for choice in ch.choices:
            by_index[choice.index] += choice.text
    assert [by_index[0], by_index[1]] == [ch.text for ch in two.choices], (by_index, two)
    expect_status(401, lambda: client(url, "wrong-key").models.list(), "wrong key", "invalid_api_key")
    status, text = get(url.replace("/v1", "/health"))
    assert status == 200 and json.loads(text)["status"] == "ok", text
    status, _ = get(url.replace("/v1", "/metrics"))
    assert status == 401, "/metrics needs the key"
    status, m = get(url.replace("/v1", "/metrics"), key)
    assert status == 200, m
    for name in ["pocketmoe_requests_total{route=\"/v1/chat/completions\",status=\"200\"}",
                 "pocketmoe_generated_tokens_total", "pocketmoe_queue_depth",
                 "pocketmoe_generation_tokens_per_second", "pocketmoe_requests_total{route=\"/v1/chat/completions\",status=\"400\"}"]:
        assert name in m, f"{name} missing from /metrics:\n{m}"
    # A client that goes away mid-stream frees its sequence at once.
    metric = lambda name: read_metric(url, key, name)  # noqa: E731

    before = metric("pocketmoe_requests_cancelled_total")
    s = c.chat.completions.create(model=model, messages=msgs, max_tokens=200, stream=True)
    it = iter(s)
    next(it), next(it)
    s.close()
    t0 = time.time()
    while metric("pocketmoe_requests_cancelled_total") < before + 1 or metric("pocketmoe_active_sequences") > 0:
        assert time.time() - t0 < 30, "the abandoned stream's sequence was not freed"
        time.sleep(0.05)
    print("real: ok")


def load(url, model, key):
    """16 concurrent streams (fixed seeds, mixed greedy / sampled, chat / completion, different
    lengths, so sequences join and leave the batch at different steps) vs each alone."""
    c = client(url, key)
    reqs = []
    for i in range(16):
        kw = dict(max_tokens=4 + 2 * i, seed=1000 + i, temperature=0 if i % 3 == 0 else 0.9, extra_body={"top_k": 0 if i % 2 else 40})
        if i % 4 == 3:
            reqs.append(("completion", dict(prompt=f"Story number {i}: the", **kw)))
        else:
            reqs.append(("chat", dict(messages=[{"role": "user", "content": f"Request {i}: tell me about item {i * 7}."}], **kw)))

    def run(kind, kw):
        if kind == "chat":
            text, finish, usage, _ = stream_chat(c, model, stream_options={"include_usage": True}, **kw)
            return text, finish, usage.completion_tokens
        text, finish, usage = "", None, None
        for ch in c.completions.create(model=model, stream=True, stream_options={"include_usage": True}, **kw):
            if ch.usage is not None:
                usage = ch.usage
            for choice in ch.choices:
                text += choice.text
                finish = choice.finish_reason or finish
        return text, finish, usage.completion_tokens

    results = [None] * len(reqs)
    errors = []

    def worker(i):
        try:
            results[i] = run(*reqs[i])
        except Exception as e:  # reported below
            errors.append((i, repr(e)))

    passes0 = read_metric(url, key, "pocketmoe_forward_passes_total")
    gen0 = read_metric(url, key, "pocketmoe_generated_tokens_total")
    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    together_s = time.time() - t0
    assert not errors, errors
    assert all(r is not None for r in results), results
    n_tok = sum(r[2] for r in results)
    # The streams really ran together: a server that decodes one request at a time makes at most
    # one generated token per forward pass. Here ~300 tokens of 16 requests (4..34 each) take
    # ~40 passes when batched (~7 per pass); 2 leaves room for requests that arrive late on a
    # loaded CI machine and still fails a sequential server.
    passes = read_metric(url, key, "pocketmoe_forward_passes_total") - passes0
    gen = read_metric(url, key, "pocketmoe_generated_tokens_total") - gen0
    assert gen == n_tok, (gen, n_tok)
    assert gen >= 2 * passes, f"streams did not overlap: {gen:.0f} tokens in {passes:.0f} forward passes"
    t0 = time.time()
    alone = [run(*r) for r in reqs]
    alone_s = time.time() - t0
    for i, (a, b) in enumerate(zip(results, alone)):
        assert a == b, f"request {i}: batched {a!r} != alone {b!r}"
        assert a[1] in ("stop", "length") and a[2] > 0, a
    print(f"load: ok: 16 streams, {n_tok} tokens in {passes:.0f} forward passes, {n_tok / together_s:.1f} tok/s together, "
          f"{n_tok / alone_s:.1f} tok/s one at a time")


def mock(qwen_url, harmony_url):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for url in (qwen_url, harmony_url):
        c = client(url)
        r = c.chat.completions.create(model="mock", messages=ask, tools=tools)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        calls = ch.message.tool_calls
        assert len(calls) == 1, calls
        assert calls[0].type == "function" and calls[0].id.startswith("call_")
        assert calls[0].function.name == "get_weather"
        assert calls[0].function.arguments.replace(" ", "") == '{"city":"Paris"}', calls[0].function.arguments
        assert not ch.message.content, ch.message.content
        reasoning = ch.message.model_extra.get("reasoning_content")
        assert reasoning and "weather" in reasoning, ch.message

        # Streamed: the deltas accumulate to the same call.
        name, args, ids, finish, reasoning_s = "", "", set(), None, ""
        for chunk in c.chat.completions.create(model="mock", messages=ask, tools=tools, stream=True):
            for choice in chunk.choices:
                d = choice.delta
                reasoning_s += (d.model_extra or {}).get("reasoning_content") or ""
                for tc in d.tool_calls or []:
                    assert tc.index == 0
                    if tc.id:
                        ids.add(tc.id)
                    if tc.function and tc.function.name:
                        name += tc.function.name
                    if tc.function and tc.function.arguments:
                        args += tc.function.arguments
                finish = choice.finish_reason or finish
        assert finish == "tool_calls" and name == "get_weather" and len(ids) == 1, (finish, name, ids)
        assert args.replace(" ", "") == '{"city":"Paris"}', args
        assert reasoning_s == reasoning, (reasoning_s, reasoning)

        # A plain answer: reasoning split from content, stream = non-stream.
        hi = [{"role": "user", "content": "Hi"}]
        r = c.chat.completions.create(model="mock", messages=hi)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "stop" and m.tool_calls is None
        assert m.content == "Hello! How can I help?", m.content
        assert m.model_extra.get("reasoning_content"), m
        text, finish, _, _ = stream_chat(c, "mock", messages=hi)
        assert text == m.content and finish == "stop"
    print("mock: ok")


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    {"real": real, "load": load, "mock": mock}[mode](*args)
