"""A misbehaving OpenAI-compatible server on loopback: every fault is caught, counted and bounded in time.

The server is a real ``http.server`` in a thread; each request takes the next
fault from a script. The clients under test are the real ``LLMSimulator`` and
``OpenAIJudge`` (httpx + tenacity), with short deadlines so the suite stays fast.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slca.env.llm import ChatClient, EndpointError, LLMSimulator
from slca.generation.rollout import answer_turn
from slca.rewards import OpenAIJudge
from slca.rewards.execution import Unscorable
from slca.types import ParsedTurn, Task, ToolCall

from _helpers import chat_completion
from _helpers import SECRET_KEY, SECRET_PASS, SECRET_QUERY, no_secret

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "response": {"type": "object", "required": ["temp_c"], "properties": {"temp_c": {"type": "integer"}}},
}}
GOOD = json.dumps({"temp_c": 21})
def _envelope(content) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()


class _Server:
    def __init__(self):
        self.script: list[tuple[str, object]] = []
        self.arrivals: list[float] = []
        self.bodies: list[dict] = []
        self.lock = threading.Lock()


def _handler(srv: _Server):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, status: int, raw: bytes, length: int | None = None):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw) if length is None else length))
            self.end_headers()
            self.wfile.write(raw)
            self.wfile.flush()

        def _reset(self):  # RST instead of FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with srv.lock:
                srv.arrivals.append(time.monotonic())
                srv.bodies.append(json.loads(body))
                kind, value = srv.script.pop(0) if srv.script else ("content", GOOD)
            try:
                self._fault(kind, value)
            except OSError:  # the client hung up (deadline): expected for drips and stalls
                self.close_connection = True

        def _fault(self, kind, value):
            if kind == "content":
                self._send(200, _envelope(value))
            elif kind == "raw":
                self._send(200, value)
            elif kind == "status":
                self._send(int(value[0]), value[1].encode())
            elif kind == "close":  # no response at all
                self.close_connection = True
            elif kind == "reset":
                self._reset()
            elif kind == "short":  # promises 1,000 bytes, sends 20, closes
                self._send(200, _envelope(GOOD)[:20], length=1000)
                self.close_connection = True
            elif kind == "short_reset":
                self._send(200, _envelope(GOOD)[:20], length=1000)
                self._reset()
            elif kind == "drip":  # headers at once, then one body byte every `value` s
                raw = _envelope(GOOD)
                self.send_response(200)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.flush()
                for b in raw:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(float(value))
            elif kind == "drip_headers":  # the status line, then a header byte every `value` s
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for b in b"X-Slow: " + b"a" * 200:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(float(value))
            elif kind == "stall":
                time.sleep(float(value))
                self.close_connection = True
            else:  # pragma: no cover - a typo in a test
                raise AssertionError(kind)

    return H


@pytest.fixture()
def server():
    srv = _Server()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(srv))
    httpd.daemon_threads = True
    httpd.block_on_close = False
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    host, port = httpd.server_address
    srv.url = f"http://127.0.0.1:{port}/v1"
    srv.secret_url = f"http://user:{SECRET_PASS}@127.0.0.1:{port}/v1?api_key={SECRET_QUERY}"
    yield srv
    httpd.shutdown()
    httpd.server_close()


def _sim(url, **kw):
    kw = {"timeout": 5.0, "http_attempts": 1, "backoff": 0.01, "max_retries": 0, **kw}
    return LLMSimulator([TOOL], base_url=url, model="sim", api_key=SECRET_KEY, **kw)


SLOW = 1.0  # the deadline where a fault is slowness (drips, stalls); others get 5 s, so a loaded machine cannot turn them into timeouts
FAULTS = [  # (script entry, metric it is counted under, the request deadline, bound on the call's seconds)
    (("close", None), "connection_errors", 5.0, 3.0),
    (("reset", None), "connection_errors", 5.0, 3.0),
    (("short", None), "incomplete_responses", 5.0, 3.0),
    (("short_reset", None), "incomplete_responses", 5.0, 3.0),
    (("drip", 0.05), "timeouts", SLOW, SLOW + 2.0),
    (("drip_headers", 0.05), "timeouts", SLOW, SLOW + 2.0),
    (("stall", 3.0), "timeouts", SLOW, SLOW + 2.0),
    (("status", (503, '{"error": "overloaded; key sk-server-leak-4242"}')), "http_errors", 5.0, 3.0),
    (("raw", b'{"choices": [{"message": '), "bad_responses", 5.0, 3.0),
    (("raw", b"[" * 5000 + b"]" * 5000), "bad_responses", 5.0, 3.0),
    (("raw", b'{"choices": ' + b"[" * 5000 + b"]" * 5000 + b"}"), "bad_responses", 5.0, 3.0),
    (("raw", b"\xff\xfe not utf-8"), "bad_responses", 5.0, 3.0),
    (("raw", b'{"choices": [{"message": {"content": 5}}]}'), "bad_responses", 5.0, 3.0),
    (("raw", b'{"x": "' + b"a" * (1 << 20) + b'"}'), "bad_responses", 5.0, 4.0),  # more than max_response_bytes
]


@pytest.mark.parametrize("fault,metric,deadline,bound", FAULTS, ids=[f"{f[0]}-{i}" for i, (f, *_) in enumerate(FAULTS)])
def test_every_fault_is_a_structured_error_counted_and_bounded(server, caplog, fault, metric, deadline, bound):
    server.script = [fault]
    sim = _sim(server.secret_url, timeout=deadline)
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        r = sim.call("get_weather", {"city": "Oslo"})
    elapsed = time.perf_counter() - t0
    assert not r.ok and "tool simulator unavailable" in r.error
    assert sim.metrics[metric] == 1 and sim.metrics["requests"] == 1 and sim.metrics["failed"] == 1
    assert elapsed < bound, elapsed
    # nothing the policy or a report reads carries a credential or the server's body
    _, msgs = answer_turn(ParsedTurn(calls=[ToolCall("get_weather", {"city": "Oslo"})]), sim)
    no_secret(r.error, msgs[0]["content"], caplog.text)
    assert "overloaded" not in r.error


def test_transient_faults_are_retried_with_exponential_backoff(server):
    server.script = [("reset", None), ("status", (503, "busy")), ("short", None), ("content", GOOD)]
    sim = _sim(server.url, timeout=5.0, http_attempts=4, backoff=0.1, max_backoff=2.0)  # (a loaded machine: no timeouts here)
    r = sim.call("get_weather", {"city": "Oslo"})
    assert r.ok and r.content == {"temp_c": 21}
    m = sim.metrics
    assert (m["connection_errors"], m["http_errors"], m["incomplete_responses"]) == (1, 1, 1)
    assert m["requests"] == 4 and m["http_retries"] == 3 and m["failed"] == 0
    gaps = [b - a for a, b in zip(server.arrivals, server.arrivals[1:])]
    # waits of 0.1, 0.2, 0.4 s (+ up to 0.1 s jitter each): they grow, not 3 attempts in 2 ms
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2 and gaps[2] >= 0.4, gaps


def test_attempts_are_bounded_and_client_errors_are_not_retried(server):
    server.script = [("close", None)] * 3
    sim = _sim(server.url, timeout=5.0, http_attempts=3)
    r = sim.call("get_weather", {"city": "Oslo"})
    assert not r.ok and "after 3 HTTP attempts" in r.error
    assert sim.metrics["connection_errors"] == 3 and sim.metrics["requests"] == 3
    server.script = [("status", (401, '{"error": "bad key"}'))]
    sim = _sim(server.url, timeout=5.0, http_attempts=3)
    r = sim.call("get_weather", {"city": "Oslo"})
    assert not r.ok and "HTTP 401" in r.error and sim.metrics["requests"] == 1 and sim.metrics["http_retries"] == 0


def test_unreachable_server_is_a_counted_connection_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = _sim(f"http://127.0.0.1:{port}/v1", http_attempts=2)
    t0 = time.perf_counter()
    r = sim.call("get_weather", {"city": "Oslo"})
    assert not r.ok and sim.metrics["connection_errors"] == 2 and time.perf_counter() - t0 < 2.0


def test_deep_or_invalid_content_is_asked_again_with_feedback(server):
    deep = '{"temp_c": ' + "[" * 5000 + "]" * 5000 + "}"
    server.script = [("content", deep), ("content", '{"temp_c": 1e999}'), ("content", GOOD)]
    sim = _sim(server.url, timeout=5.0, max_retries=2)
    r = sim.call("get_weather", {"city": "Oslo"})
    assert r.ok and sim.metrics["invalid_json"] == 2 and sim.metrics["retries"] == 2
    feedback = server.bodies[1]["messages"][-1]["content"]
    assert "nested deeper than 64" in feedback


def test_total_deadline_is_not_per_read(server):
    """The issue's case: a byte every 0.3 s held a timeout=1.0 call for 13 s."""
    server.script = [("drip", 0.3)]
    t0 = time.perf_counter()
    with pytest.raises(EndpointError) as e:
        chat_completion(server.url, "m", [{"role": "user", "content": "hi"}], timeout=1.0)
    assert e.value.kind == "timeout" and time.perf_counter() - t0 < 1.8


def test_client_pickles_and_works_after(server):
    import pickle

    client = ChatClient(server.url, timeout=5.0)
    assert client.complete("m", []) == GOOD
    clone = pickle.loads(pickle.dumps(client))  # the connection pool stays behind; a new one opens
    assert clone.complete("m", []) == GOOD and clone.metrics["requests"] == 2
    client.close()
    assert client.complete("m", []) == GOOD


TASK = Task(id="t", messages=[{"role": "user", "content": "weather in Oslo?"}], tools=[TOOL])


@pytest.mark.parametrize("fault,metric,deadline,bound", FAULTS[:9], ids=[f[0] for f, *_ in FAULTS[:9]])
def test_judge_faults_are_unscorable_counted_and_bounded(server, caplog, fault, metric, deadline, bound):
    server.script = [fault]
    judge = OpenAIJudge(server.secret_url, "judge", api_key=SECRET_KEY, timeout=deadline, http_attempts=1, backoff=0.01)
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="slca.env"), pytest.raises(Unscorable) as e:
        judge.score(TASK, [], "It is 21 C.")
    assert time.perf_counter() - t0 < bound
    assert judge.metrics[metric] == 1 and judge.metrics["requests"] == 1
    no_secret(str(e.value), caplog.text)


def test_judge_recovers_after_transient_faults(server):
    server.script = [("close", None), ("status", (502, "bad gateway")), ("content", '{"score": 9}')]
    judge = OpenAIJudge(server.url, "judge", timeout=5.0, http_attempts=3, backoff=0.01)
    assert judge.score(TASK, [], "It is 21 C.") == pytest.approx(0.9)
    assert judge.metrics["connection_errors"] == 1 and judge.metrics["http_errors"] == 1 and judge.metrics["http_retries"] == 2


# ------------------------------------------------- issue 30: a real server's habits (transformers serve)

def _tool_call_reply(content) -> bytes:
    """A reply as ``transformers serve`` gives it when its response template parsed the model's turn into a call."""
    calls = [{"id": "r_tool_call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    return json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls",
                                    "message": {"role": "assistant", "content": content, "tool_calls": calls}}]}).encode()


CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


@pytest.mark.parametrize("content", ["", None])
def test_a_reply_the_server_parsed_into_tool_calls_reaches_the_simulator_as_the_models_text(server, content):
    """A model asked to play the tool wrote a tool call and the server turned it into OpenAI ``tool_calls`` with no
    text: the simulator sees the call as the model wrote it, counts it, and asks again with that as the feedback."""
    server.script = [("raw", _tool_call_reply(content)), ("content", GOOD)]
    sim = _sim(server.url, max_retries=1)
    r = sim.call("get_weather", {"city": "Oslo"})
    assert r.ok and r.content == {"temp_c": 21}
    assert sim.metrics["tool_call_replies"] == 1 and sim.metrics["invalid_json"] == 1 and sim.metrics["bad_responses"] == 0
    assert server.bodies[1]["messages"][-2] == {"role": "assistant", "content": CALL_TEXT}


def test_a_judge_that_answers_with_a_tool_call_is_asked_again(server):
    server.script = [("raw", _tool_call_reply(None)), ("content", '{"score": 7}')]
    judge = OpenAIJudge(server.url, "judge", timeout=5.0, http_attempts=1, max_retries=1)
    assert judge.score(TASK, [], "It is 21 C.") == pytest.approx(0.7)
    assert judge.metrics["tool_call_replies"] == 1 and judge.metrics["invalid_output"] == 1


def test_max_tokens_is_sent_only_when_set(server):
    _sim(server.url, max_tokens=24).call("get_weather", {"city": "Oslo"})
    _sim(server.url).call("get_weather", {"city": "Paris"})
    server.script = [("content", '{"score": 5}')]
    OpenAIJudge(server.url, "judge", timeout=5.0, http_attempts=1, max_tokens=8).score(TASK, [], "It is 21 C.")
    assert server.bodies[0]["max_tokens"] == 24 and "max_tokens" not in server.bodies[1] and server.bodies[2]["max_tokens"] == 8
    with pytest.raises(ValueError, match="max_tokens"):
        _sim(server.url, max_tokens=0)
    with pytest.raises(ValueError, match="max_tokens"):
        OpenAIJudge(server.url, "judge", max_tokens=0)


# ------------------------------------------------- issue 26 (6): `timeout` is the request's total deadline

MARGIN = 0.4  # thread scheduling on a loaded test machine, on top of the documented DEADLINE_SLACK


def _one_request(who, url, timeout, **http):
    """One request of ``who`` (the bare client, the simulator's call, the judge's score) with the default
    attempts and backoff unless given; returns (seconds, metrics, what it returned or raised)."""
    from slca.env.llm import ChatClient

    t0 = time.perf_counter()
    if who == "client":
        c = ChatClient(url, timeout=timeout, **http)
        try:
            out = c.complete("m", [{"role": "user", "content": "hi"}])
        except EndpointError as e:
            out = e
        metrics = c.metrics
    elif who == "simulator":
        sim = LLMSimulator([TOOL], base_url=url, model="sim", timeout=timeout, **http)
        out, metrics = sim.call("get_weather", {"city": "Oslo"}), sim.metrics
    else:
        judge = OpenAIJudge(url, "judge", timeout=timeout, **http)
        try:
            out = judge.score(TASK, [], "It is 21 C.")
        except Unscorable as e:
            out = e
        metrics = judge.metrics
    return time.perf_counter() - t0, metrics, out


@pytest.mark.parametrize("who", ["client", "simulator", "judge"])
@pytest.mark.parametrize("fault", [("drip", 0.25), ("drip_headers", 0.25), ("stall", 6.0)], ids=lambda f: f[0])
def test_timeout_is_the_requests_total_deadline_with_default_retries(server, who, fault):
    """The issue's case: a byte every 0.25 s kept a timeout=1.0 call running past 4 s (three attempts of 1 s
    and the backoff between them). With the default attempts and backoff the request ends within
    timeout + DEADLINE_SLACK, as one attempt counted as one timeout fault."""
    from slca.env.llm import DEADLINE_SLACK

    server.script = [fault] * 5
    elapsed, m, out = _one_request(who, server.url, 1.0)
    assert elapsed < 1.0 + DEADLINE_SLACK + MARGIN, elapsed
    assert m["timeouts"] == 1 and m["requests"] == 1 and m["http_retries"] == 0, dict(m)
    if who == "client":
        assert isinstance(out, EndpointError) and out.kind == "timeout"
    elif who == "simulator":
        assert not out.ok and "timeout" in out.error and m["failed"] == 1
    else:
        assert isinstance(out, Unscorable) and "within 1.0 s" in str(out)


@pytest.mark.parametrize("who", ["client", "simulator", "judge"])
def test_fast_faults_are_retried_only_while_the_deadline_allows(server, who):
    """Connection faults fail at once and are retried, but no wait is taken that would end past the deadline:
    with backoff 0.4 s (waits of 0.4-0.8 s, then 0.8-1.2 s) and timeout=1.0 at most two of the 6 attempts run."""
    server.script = [("close", None)] * 6
    elapsed, m, out = _one_request(who, server.url, 1.0, http_attempts=6, backoff=0.4)
    assert elapsed < 1.0 + MARGIN, elapsed
    assert 1 <= m["requests"] <= 2 and m["connection_errors"] == m["requests"] and m["timeouts"] == 0, dict(m)
    assert m["http_retries"] == m["requests"] - 1


def test_deadline_holds_when_a_cancelled_attempt_does_not_stop(server, monkeypatch):
    """The calling thread waits DEADLINE_SLACK at most for a cancelled attempt: an attempt that ignores its
    cancellation (here: keeps sleeping 3 s) cannot hold the request past timeout + DEADLINE_SLACK."""
    import asyncio

    from slca.env.llm import DEADLINE_SLACK

    async def stubborn(self, client, body, left):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(3)  # swallows the cancellation for 3 s
        return 200, _envelope(GOOD)

    monkeypatch.setattr(ChatClient, "_post", stubborn)
    elapsed, m, out = _one_request("client", server.url, 0.5)
    assert isinstance(out, EndpointError) and out.kind == "timeout"
    assert elapsed < 0.5 + DEADLINE_SLACK + MARGIN, elapsed
    assert m["timeouts"] == 1 and m["requests"] == 1


def test_a_slow_but_timely_reply_is_read_whole(server):
    """The deadline counts the whole request, not each read: a reply dripped over ~0.5 s arrives within 3 s."""
    server.script = [("drip", 0.01)]
    elapsed, m, out = _one_request("client", server.url, 3.0)
    assert out == GOOD and m["timeouts"] == 0 and elapsed < 3.0
