"""Simulator backends: schema-guided, Python callables, and the LLM one against a real loopback HTTP server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from slca.env import PythonSimulator, SchemaSimulator, Simulator, ToolError
from slca.env.llm import EndpointError, LLMSimulator

from _helpers import chat_completion


def fn(name, params, required, response=None, stateful=False, **extra):
    f = {"name": name, "description": f"{name} tool", "parameters": {"type": "object", "properties": params, "required": required}}
    if response is not None:
        f["response"] = response
    f["x-stateful"] = stateful
    f.update(extra)
    return {"type": "function", "function": f}


HOTEL = fn(
    "book_hotel",
    {"city": {"type": "string"}, "nights": {"type": "integer", "minimum": 1}},
    ["city", "nights"],
    {"type": "object", "required": ["booking_id", "status", "total"],
     "properties": {"booking_id": {"type": "string"}, "status": {"type": "string", "enum": ["confirmed", "waitlisted"]},
                    "total": {"type": "number", "minimum": 50, "maximum": 900}}},
    stateful=True,
)
LOOKUP = fn(
    "get_booking",
    {"booking_id": {"type": "string"}},
    ["booking_id"],
    {"type": "object", "required": ["booking_id", "city", "nights", "status"],
     "properties": {"booking_id": {"type": "string"}, "city": {"type": "string"}, "nights": {"type": "integer"},
                    "status": {"type": "string", "enum": ["confirmed", "waitlisted"]}}},
)
RICH = fn(
    "profile",
    {"user": {"type": "string", "enum": ["ann", "bob"]}, "verbose": {"type": "boolean"}},
    ["user"],
    {
        "type": "object",
        "required": ["id", "email", "joined", "seen", "site", "uid", "score", "level", "tags", "address", "ip", "note", "ratio"],
        "properties": {
            "id": {"type": "string"},
            "email": {"type": "string", "format": "email"},
            "joined": {"type": "string", "format": "date"},
            "seen": {"type": "string", "format": "date-time"},
            "site": {"type": "string", "format": "uri"},
            "uid": {"type": "string", "format": "uuid"},
            "ip": {"type": "string", "format": "ipv4"},
            "score": {"type": "integer", "minimum": 3, "exclusiveMaximum": 10, "multipleOf": 3},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "multipleOf": 0.25},
            "level": {"type": "string", "enum": ["low", "mid", "high"]},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 5}, "minItems": 2, "maxItems": 4},
            "address": {"type": "object", "required": ["street", "zip"],
                        "properties": {"street": {"type": "string"}, "zip": {"type": "integer", "minimum": 10000, "maximum": 99999}}},
            "note": {"type": ["null", "string"], "maxLength": 8},
        },
    },
)


def validate(schema, value):
    Draft202012Validator(schema, format_checker=FormatChecker()).validate(value)


# ------------------------------------------------------------------ schema backend


def test_schema_backend_output_conforms_to_rich_response_schema():
    sim = SchemaSimulator([RICH], seed=1)
    assert isinstance(sim, Simulator)
    outs = []
    for user in ("ann", "bob"):
        for verbose in (True, False):
            r = sim.call("profile", {"user": user, "verbose": verbose})
            assert r.ok, r.error
            validate(RICH["function"]["response"], r.content)
            outs.append(r.content)
    assert len({json.dumps(o, sort_keys=True) for o in outs}) == 4
    assert outs[0]["address"]["zip"] >= 10000 and outs[0]["score"] in (3, 6, 9)


def test_schema_backend_is_deterministic_and_seeded():
    a, b, c = SchemaSimulator([HOTEL], seed=0), SchemaSimulator([HOTEL], seed=0), SchemaSimulator([HOTEL], seed=7)
    args = {"city": "Oslo", "nights": 3}
    ra, rb, rc = (s.call("book_hotel", args, episode=0) for s in (a, b, c))
    assert ra == rb and ra != rc


def test_schema_backend_same_call_same_answer_within_episode():
    sim = SchemaSimulator([LOOKUP], seed=3)
    r1 = sim.call("get_booking", {"booking_id": "X1"}, episode="e1")
    r2 = sim.call("get_booking", {"booking_id": "X1"}, episode="e1")
    assert r1 == r2 and sim.metrics["cache_hits"] == 1
    assert r1.content["booking_id"] == "X1"  # a response field named like an argument echoes it


def test_schema_backend_state_persists_within_episode_only():
    sim = SchemaSimulator([HOTEL, LOOKUP], seed=0)
    made = sim.call("book_hotel", {"city": "Lima", "nights": 4}, episode="a")
    assert made.ok
    bid = made.content["booking_id"]
    found = sim.call("get_booking", {"booking_id": bid}, episode="a").content
    assert (found["city"], found["nights"], found["status"]) == ("Lima", 4, made.content["status"])
    other = sim.call("get_booking", {"booking_id": bid}, episode="b").content
    assert (other["city"], other["nights"]) != ("Lima", 4)
    sim.reset("a")
    assert sim.call("get_booking", {"booking_id": bid}, episode="a").content == other


@pytest.mark.parametrize(
    "name,args,needle",
    [
        ("teleport", {}, "unknown tool"),
        ("book_hotel", {"city": "Oslo"}, "'nights' is a required property"),
        ("book_hotel", {"city": "Oslo", "nights": "two"}, "'two' is not of type 'integer'"),
        ("book_hotel", {"city": "Oslo", "nights": 0}, "minimum"),
        ("profile", {"user": "eve"}, "is not one of"),
        ("book_hotel", ["Oslo", 2], "must be a JSON object"),
    ],
)
def test_schema_backend_rejects_bad_calls_readably(name, args, needle):
    sim = SchemaSimulator([HOTEL, RICH])
    r = sim.call(name, args)
    assert not r.ok and r.content is None and needle in r.error
    assert sim.metrics["unknown_tool" if name == "teleport" else "invalid_arguments"] == 1


def test_tool_without_response_schema_echoes():
    sim = SchemaSimulator([fn("ping", {"host": {"type": "string"}}, ["host"])])
    assert sim.call("ping", {"host": "a"}).content == {"status": "ok", "host": "a"}


def test_invalid_tool_schema_rejected_with_its_name():
    bad = fn("broken", {"x": {"type": "strnig"}}, ["x"])
    with pytest.raises(ValueError, match="broken.*invalid parameters schema"):
        SchemaSimulator([bad])
    with pytest.raises(ValueError, match="duplicate"):
        SchemaSimulator([HOTEL, HOTEL])
    bad_resp = fn("r", {}, [], {"type": "object", "properties": {"a": {"minimum": "zero"}}})
    with pytest.raises(ValueError, match="'r'.*response"):
        SchemaSimulator([bad_resp])


# ------------------------------------------------------------------ python backend


def test_python_backend_real_callables_with_state():
    def book(city, nights, state):
        bid = f"H{len(state.setdefault('b', {})) + 1}"
        state["b"][bid] = {"booking_id": bid, "city": city, "nights": nights, "status": "confirmed"}
        return {"booking_id": bid, "status": "confirmed", "total": 100.0 * nights}

    def lookup(booking_id, state):
        if booking_id not in state.get("b", {}):
            raise ToolError(f"no booking {booking_id}")
        return state["b"][booking_id]

    sim = PythonSimulator([HOTEL, LOOKUP], {"book_hotel": book, "get_booking": lookup})
    r = sim.call("book_hotel", {"city": "Rome", "nights": 2}, episode=1)
    assert r.ok and r.content == {"booking_id": "H1", "status": "confirmed", "total": 200.0}
    assert sim.call("get_booking", {"booking_id": "H1"}, episode=1).content["city"] == "Rome"
    miss = sim.call("get_booking", {"booking_id": "H1"}, episode=2)
    assert not miss.ok and "no booking H1" in miss.error
    # a stateful tool is an action: repeating it books again
    assert sim.call("book_hotel", {"city": "Rome", "nights": 2}, episode=1).content["booking_id"] == "H2"
    assert not sim.call("book_hotel", {"city": "Rome"}, episode=1).ok


def test_python_backend_checks_output_and_does_not_hide_bugs():
    sim = PythonSimulator([HOTEL, LOOKUP], {"book_hotel": lambda city, nights: {"booking_id": 1}, "get_booking": lambda booking_id: 1 / 0})
    r = sim.call("book_hotel", {"city": "Rome", "nights": 2})
    assert not r.ok and "violates its response schema" in r.error and sim.metrics["invalid_output"] == 1
    with pytest.raises(ZeroDivisionError):
        sim.call("get_booking", {"booking_id": "x"})
    with pytest.raises(ValueError, match="no implementation"):
        PythonSimulator([HOTEL], {})


# ------------------------------------------------------------------- llm backend


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


def test_schema_backend_patterns_and_refs():
    tool = fn("lookup", {"q": {"type": "string"}}, ["q"], {
        "type": "object", "required": ["code", "item"],
        "$defs": {"Item": {"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string", "pattern": "^SKU-[0-9]{4}$"}}}},
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}, "item": {"$ref": "#/$defs/Item"}},
    })
    sim = SchemaSimulator([tool], seed=2)
    for q in "abcdefgh":
        r = sim.call("lookup", {"q": q})
        assert r.ok, r.error
        validate(tool["function"]["response"], r.content)


def test_schema_backend_serves_toolworld_with_state():
    from slca.env import toolworld as tw

    sim = SchemaSimulator(tw.TOOLS + tw.HELDOUT_TOOLS, seed=0)
    for t in tw.make_tasks("train", n=100) + tw.make_tasks("heldout_tools", n=30):
        for step in t.gold:
            for c in step:
                r = sim.call(c.name, c.arguments, episode=t.id)
                assert r.ok, r.error
    booked = sim.call("book_flight", {"flight_id": "FL123", "passenger": "Ann"}, episode="s").content
    found = sim.call("get_booking", {"booking_id": booked["booking_id"]}, episode="s").content
    assert (found["flight_id"], found["passenger"], found["status"]) == ("FL123", "Ann", booked["status"])


def _schemas():
    from hypothesis import strategies as st

    leaf = st.one_of(
        st.builds(lambda lo, span, step: {"type": "integer", "minimum": lo, "maximum": lo + span, **({"multipleOf": step} if step else {})},
                  st.integers(-50, 50), st.integers(6, 40), st.sampled_from([0, 1, 2, 5])),
        st.builds(lambda lo, span, step: {"type": "number", "minimum": lo, "maximum": lo + span, **({"multipleOf": step} if step else {})},
                  st.integers(-5, 5), st.integers(1, 9), st.sampled_from([0, 0.01, 0.1, 0.25, 0.5])),
        st.builds(lambda vals: {"type": "string", "enum": vals}, st.lists(st.sampled_from(["a", "b", "c", "dd"]), min_size=1, max_size=3, unique=True)),
        st.sampled_from([{"type": "string", "format": f} for f in ("date", "date-time", "email", "uri", "uuid", "ipv4", "time")]),
        st.builds(lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra}, st.integers(0, 6), st.integers(0, 6)),
        st.sampled_from([{"type": "string", "pattern": p} for p in ("^[A-Z]{3}[0-9]{2}$", r"^\d{4}-x$", "^(up|down)$")]),
        st.just({"type": "boolean"}),
        st.just({"type": ["string", "null"]}),
    )
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.builds(lambda items, lo, extra: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + extra}, inner, st.integers(0, 2), st.integers(0, 2)),
            st.builds(lambda props: {"type": "object", "properties": props, "required": sorted(props)},
                      st.dictionaries(st.sampled_from(["id", "name", "item_id", "n", "when", "tags"]), inner, min_size=1, max_size=4)),
            st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
        ),
        max_leaves=8,
    )


@pytest.mark.slow
def test_schema_backend_output_always_validates():
    """Property: for any response schema built from the supported keywords, every answer validates."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=150, deadline=None)
    @given(resp=_schemas(), seed=st.integers(0, 10_000), arg=st.text(max_size=5))
    def check(resp, seed, arg):
        tool = fn("t", {"a": {"type": "string"}}, ["a"], {"type": "object", "properties": {"out": resp}, "required": ["out"]})
        r = SchemaSimulator([tool], seed=seed).call("t", {"a": arg})
        assert r.ok, r.error
        validate(tool["function"]["response"], r.content)

    check()
