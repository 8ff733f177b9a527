"""The `anthropic` Python client against pocketmoe-serve's /v1/messages (issue 29): a
hard-coded Claude model name, JSON and streamed answers that agree, count_tokens, a 400."""
import sys

import anthropic

url, key = sys.argv[1], sys.argv[2]
c = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=120)
msgs = [{"role": "user", "content": "Hello there"}]
kw = dict(model="claude-3-5-haiku-latest", max_tokens=4, system="Be brief.", messages=msgs, extra_body={"temperature": 0})
m = c.messages.create(**kw)
assert m.type == "message" and m.role == "assistant", m
assert 1 <= m.usage.output_tokens <= 4 and m.usage.input_tokens > 0, m.usage
assert m.stop_reason in ("end_turn", "max_tokens"), m
text = "".join(b.text for b in m.content if b.type == "text")
with c.messages.stream(**kw) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
assert streamed == text, (streamed, text)
assert final.stop_reason == m.stop_reason, (final, m)
assert final.usage.output_tokens == m.usage.output_tokens, (final.usage, m.usage)
n = c.messages.count_tokens(model="claude-3-5-haiku-latest", system="Be brief.", messages=msgs)
assert n.input_tokens == m.usage.input_tokens, (n, m.usage)
try:
    c.messages.create(model="x", max_tokens=4, messages=[{"role": "wizard", "content": "x"}])
    raise AssertionError("a bad role got no error")
except anthropic.BadRequestError as e:
    assert e.status_code == 400, e
try:
    anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(**kw)
    raise AssertionError("a wrong key got no error")
except anthropic.AuthenticationError:
    pass
print("anthropic: ok")
