"""slca.env.llm: the chat-completions client (ChatClient), the LLM tool simulator (the paper's SGLS), redaction.

The simulator runs against a real loopback HTTP server; the fault catalogue (every way a server can
misbehave, for the simulator and the judge) is test_faults_http.py.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slca.env import llm
from slca.env.llm import ChatClient, EndpointError, LLMSimulator, parse_json_reply, redact, safe_url

from _helpers import chat_completion
from test_env_simulators import HOTEL, LOOKUP
from _helpers import SECRET_KEY, SECRET_PASS, SECRET_QUERY, no_secret


# ------------------------------------------------------------------ the simulator against a loopback server


class _Script:
    """What the loopback server answers: a queue of (kind, value) per request."""

    def __init__(self):
        self.replies: list[tuple[str, object]] = []
        self.requests: list[dict] = []
        self.lock = threading.Lock()


def _handler(script: _Script):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # keep test output quiet
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with script.lock:
                script.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                kind, value = script.replies.pop(0) if script.replies else ("content", "{}")
            if kind == "sleep":  # longer than the client's timeout: it has hung up by now
                time.sleep(float(value))
                return
            if kind == "status":
                self.send_response(int(value))
                self.end_headers()
                self.wfile.write(b'{"error": "overloaded"}')
                return
            payload = {
                "id": "cmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": value}, "finish_reason": "stop"}],
            } if kind == "content" else value
            raw = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    return Handler


@pytest.fixture()
def server():
    script = _Script()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    httpd.daemon_threads = True
    th = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    script.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield script
    httpd.shutdown()
    httpd.server_close()


def _llm(server, **kw):
    return LLMSimulator([HOTEL, LOOKUP], base_url=server.url, model="sim-model", **kw)


def test_llm_valid_output_prompt_and_cache(server):
    good = {"booking_id": "B7", "status": "confirmed", "total": 240}
    server.replies = [("content", json.dumps(good)), ("content", "```json\n" + json.dumps({**good, "city": "Kyiv", "nights": 2}) + "\n```")]
    sim = _llm(server, api_key="k")
    r = sim.call("book_hotel", {"city": "Kyiv", "nights": 2}, episode="e")
    assert r.ok and r.content == good
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer k"
    assert req["body"]["model"] == "sim-model" and req["body"]["response_format"] == {"type": "json_object"}
    user = req["body"]["messages"][-1]["content"]
    assert '"response_schema"' in user and '"Kyiv"' in user and "Earlier calls" not in user
    # the next call in the episode sees the first one; a fenced JSON reply is accepted
    r2 = sim.call("get_booking", {"booking_id": "B7"}, episode="e")
    assert r2.ok and r2.content["city"] == "Kyiv"
    assert "Earlier calls" in server.requests[1]["body"]["messages"][-1]["content"] and '"B7"' in server.requests[1]["body"]["messages"][-1]["content"]
    # same stateless call in the same episode: served from the cache, no request
    assert sim.call("get_booking", {"booking_id": "B7"}, episode="e") == r2 and len(server.requests) == 2
    assert sim.metrics["requests"] == 2 and sim.metrics["retries"] == 0


def test_llm_invalid_json_then_retry(server):
    server.replies = [("content", "Sure! The booking is confirmed."), ("content", json.dumps({"booking_id": "B1", "status": "confirmed", "total": 99.5}))]
    sim = _llm(server)
    r = sim.call("book_hotel", {"city": "Oslo", "nights": 1})
    assert r.ok and r.content["total"] == 99.5
    assert sim.metrics["invalid_json"] == 1 and sim.metrics["retries"] == 1
    retry_msgs = server.requests[1]["body"]["messages"]
    assert retry_msgs[-2] == {"role": "assistant", "content": "Sure! The booking is confirmed."}
    assert "not JSON" in retry_msgs[-1]["content"]


def test_llm_schema_violating_output_is_retried_then_reported(server):
    bad = json.dumps({"booking_id": "B1", "status": "maybe", "total": 100})
    server.replies = [("content", bad)] * 3
    sim = _llm(server, max_retries=2)
    r = sim.call("book_hotel", {"city": "Oslo", "nights": 1})
    assert not r.ok and "violates the response schema" in r.error and "after 3 attempts" in r.error
    assert sim.metrics["schema_violations"] == 3 and sim.metrics["failed"] == 1
    assert "'maybe' is not one of" in server.requests[1]["body"]["messages"][-1]["content"]


def test_llm_timeout_and_http_errors_become_structured_errors(server):
    server.replies = [("status", 503), ("status", 503)]
    sim = _llm(server, timeout=5.0, max_retries=1, http_attempts=2, backoff=0.01)
    r = sim.call("book_hotel", {"city": "Oslo", "nights": 1})
    assert not r.ok and "HTTP 503" in r.error and "after 2 HTTP attempts" in r.error
    assert sim.metrics["http_errors"] == 2 and sim.metrics["requests"] == 2
    assert sim.metrics["http_retries"] == 1 and sim.metrics["failed"] == 1
    # a timeout spends the request's whole deadline (``timeout`` is total): it is the request's last attempt
    server.replies = [("sleep", 1.0), ("status", 503)]
    sim = _llm(server, timeout=0.3, max_retries=1, http_attempts=2, backoff=0.01)
    t0 = time.perf_counter()
    r = sim.call("book_hotel", {"city": "Oslo", "nights": 1})
    assert time.perf_counter() - t0 < 1.5
    assert not r.ok and "timeout" in r.error and "after 1 HTTP attempt)" in r.error
    assert sim.metrics["timeouts"] == 1 and sim.metrics["requests"] == 1 and sim.metrics["http_retries"] == 0


def test_llm_arguments_checked_before_any_request(server):
    sim = _llm(server)
    assert not sim.call("book_hotel", {"city": "Oslo"}).ok
    assert server.requests == []


def test_chat_completion_client_errors(server):
    server.replies = [("raw", {"no": "choices"})]
    with pytest.raises(EndpointError) as e:
        chat_completion(server.url, "m", [{"role": "user", "content": "hi"}], timeout=2)
    assert e.value.kind == "bad_response"
    with pytest.raises(EndpointError) as e:
        chat_completion("http://127.0.0.1:9/v1", "m", [], timeout=2)
    assert e.value.kind == "connection_error"
    with pytest.raises(ValueError, match="base_url"):
        LLMSimulator([HOTEL], base_url="localhost:8000", model="m")


# ------------------------------------------------------------------ redaction


def test_redaction_of_urls_and_bodies():
    assert safe_url(f"https://bob:{SECRET_PASS}@api.example/v1?api_key={SECRET_QUERY}&x=1") == "https://***@api.example/v1?api_key=***&x=***"
    text = f'{{"auth": "Bearer {SECRET_KEY}", "api_key": "abc123xyz", "note": "token={SECRET_QUERY}"}}'
    out = redact(text)
    no_secret(out)
    assert "abc123xyz" not in out and "Bearer ***" in out
    client = ChatClient(f"http://u:{SECRET_PASS}@127.0.0.1:1/v1", api_key="plain-key-42")
    assert SECRET_PASS not in client.shown_url and "plain-key-42" not in client.redact("echo plain-key-42")
    with pytest.raises(ValueError) as err:
        ChatClient(f"ftp://u:{SECRET_PASS}@host/")
    assert SECRET_PASS not in str(err.value)


def test_safe_url_keeps_scheme_host_and_path_and_survives_a_broken_url():
    assert safe_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"  # nothing to hide: unchanged
    assert safe_url("http://h/v1?a=1&b=") == "http://h/v1?a=***&b=***"  # every query value masked, the names kept
    assert safe_url("http://h/v1#frag") == "http://h/v1"
    assert safe_url("http://[::1/v1") == "<invalid url>"  # urlsplit's ValueError: not raised, not echoed


def test_redact_masks_the_given_secrets_longest_first_and_skips_short_ones():
    assert redact("key abcdef here", ["abc", "abcdef"]) == "key *** here"  # not '***def'
    assert redact("ab cd", ["ab", None, ""]) == "ab cd"  # shorter than 3 characters: too common to mask
    assert redact("Authorization: Bearer eyJhbGciOi.x") == "Authorization: Bearer ***"
    assert redact('{"password": "pw-123", "user": "ann"}') == '{"password": "***", "user": "ann"}'
    assert redact("uses sk-abcdef123456 now") == "uses sk-*** now"


# ------------------------------------------------------------------ parse_json_reply


@pytest.mark.parametrize("text,want", [
    ('{"a": 1}', {"a": 1}),
    ('  {"a": 1}\n', {"a": 1}),
    ('```json\n{"a": 1}\n```', {"a": 1}),
    ("```\n[1, 2]\n```", [1, 2]),
    ("3", 3),
])
def test_parse_json_reply_reads_plain_and_fenced_json(text, want):
    assert parse_json_reply(text) == want


@pytest.mark.parametrize("text,reason", [
    ("Sure! It is sunny.", "Expecting value"),
    ('{"a": 1} and more', "Extra data"),
    ("[" * 100 + "]" * 100, "nested deeper than 64"),
    ('{"t": NaN}', "NaN is not JSON"),
    ('{"n": 1e999}', "out of range"),
    ('"\\ud800"', "lone surrogate"),
])
def test_parse_json_reply_refuses_with_the_reason(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_json_reply(text)


# ------------------------------------------------------------------ ChatClient and EndpointError


@pytest.mark.parametrize("kw,needle", [
    (dict(timeout=0), "timeout must be > 0"),
    (dict(timeout=float("nan")), "timeout must be > 0"),
    (dict(http_attempts=0), "http_attempts must be >= 1"),
    (dict(backoff=-0.1), "backoff and max_backoff must be >= 0"),
    (dict(max_backoff=float("nan")), "backoff and max_backoff must be >= 0"),
])
def test_chat_client_refuses_bad_settings(kw, needle):
    with pytest.raises(ValueError, match=needle):
        ChatClient("http://127.0.0.1:1/v1", **kw)


def test_chat_client_posts_to_chat_completions_under_the_base_url():
    c = ChatClient("https://api.example/v1/", timeout=2, http_attempts=2)
    assert c.url == "https://api.example/v1/chat/completions" and c.shown_url == c.url
    assert (c.timeout, c.http_attempts) == (2.0, 2) and isinstance(c.timeout, float)
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        ChatClient("127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="base_url"):
        ChatClient(None)


def test_endpoint_error_defaults():
    e = EndpointError("timeout", "no answer")
    assert (e.kind, e.status, e.retryable, e.attempts, str(e)) == ("timeout", None, True, 1, "no answer")
    assert set(llm.FAULT_METRICS) == {"timeout", "connection_error", "incomplete_response", "http_error", "bad_response"}


@pytest.mark.parametrize("status,retried", [(429, True), (408, True), (500, True), (404, False), (400, False)])
def test_which_http_statuses_are_retried(server, status, retried):
    server.replies = [("status", status), ("content", "ok")]
    client = ChatClient(server.url, timeout=5.0, http_attempts=2, backoff=0.01)
    if retried:
        assert client.complete("m", []) == "ok" and client.metrics["http_retries"] == 1
    else:
        with pytest.raises(EndpointError) as e:
            client.complete("m", [])
        assert (e.value.kind, e.value.status, e.value.retryable, e.value.attempts) == ("http_error", status, False, 1)
        assert f"HTTP {status}" in str(e.value) and "overloaded" not in str(e.value)  # never the server's body
    assert client.metrics["http_errors"] == 1 and client.metrics["requests"] == 1 + retried
    client.close()


def test_tool_calls_the_server_parsed_come_back_as_hermes_text_and_never_raise():
    one = llm._calls_as_text({"name": "f", "arguments": '{"x": 1}'})  # one call, arguments as a JSON string
    assert one == '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    many = llm._calls_as_text([{"function": {"name": "f", "arguments": "not json"}}, "weird", {"name": "g", "arguments": {1, 2}}])
    blocks = [json.loads(b.split("\n")[1]) for b in many.split("\n<tool_call>")]
    assert blocks == [{"name": "f", "arguments": "not json"}, {"name": None, "arguments": None}, {"name": "g", "arguments": "{1, 2}"}]


# ------------------------------------------------------------------ LLMSimulator


def test_llm_simulator_refuses_bad_settings_and_exposes_its_client(server):
    with pytest.raises(ValueError, match="max_retries must be >= 0"):
        _llm(server, max_retries=-1)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        _llm(server, max_tokens=0)
    with pytest.raises(ValueError, match="duplicate"):
        LLMSimulator([HOTEL, HOTEL], base_url=server.url, model="m")
    sim = _llm(server, timeout=3, http_attempts=1)
    assert sim.base_url == server.url and sim.timeout == 3.0 and sim.client.metrics is sim.metrics


def test_llm_prompt_holds_the_tool_the_call_and_at_most_max_history_earlier_calls(server):
    sim = _llm(server, max_history=1)
    system, user = sim.prompt("get_booking", {"booking_id": "B1"}, episode="e")
    assert system["role"] == "system" and "tool simulator" in system["content"]
    assert user["role"] == "user" and user["content"].endswith("Reply with the tool's JSON result only.")
    tool = json.loads(user["content"].split("\n")[1])
    assert tool["name"] == "get_booking" and tool["response_schema"] == LOOKUP["function"]["response"]
    sim.state("e")["history"] = [{"name": "book_hotel", "arguments": {"city": c}, "result": {}} for c in ("Oslo", "Rome")]
    text = sim.prompt("get_booking", {"booking_id": "B1"}, episode="e")[1]["content"]
    assert "Earlier calls" in text and "Rome" in text and "Oslo" not in text  # only the last max_history calls
    assert "Earlier calls" not in sim.prompt("get_booking", {"booking_id": "B1"}, episode="other")[1]["content"]


def test_llm_sends_its_sampling_settings(server):
    server.replies = [("content", json.dumps({"booking_id": "B1", "city": "Oslo", "nights": 1, "status": "confirmed"}))]
    sim = _llm(server, temperature=0.5, seed=7, max_tokens=64)
    assert sim.call("get_booking", {"booking_id": "B1"}).ok
    body = server.requests[0]["body"]
    assert (body["temperature"], body["seed"], body["max_tokens"]) == (0.5, 7, 64)
