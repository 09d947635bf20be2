"""Hostile model output, fuzzed: no exception escapes a format or a simulator, in bounded time.

Generated model outputs (hypothesis, derandomized so a failure reproduces):

=============================================  ========  =======  =========
test                                           examples  outputs  per example
=============================================  ========  =======  =========
``test_formats_never_raise_on_mixed_text``     1200      4,800    4 formats
``test_formats_never_raise_on_mutated_calls``  700       2,800    4 formats
``test_formats_bound_deep_and_huge_json``      120       480      4 formats
``test_render_parse_round_trip``               400       1,600    4 formats
``test_render_parse_refuses_lone_surrogates``  400       1,600    4 formats
``test_schema_simulator_on_fuzzed_calls``      600       600      parsed calls
``test_python_simulator_on_fuzzed_calls``      400       400      parsed calls
``test_llm_simulator_on_fuzzed_replies``       60        60       HTTP replies
``test_bounded_loads_agrees_with_json...``     300       300      the decoder
=============================================  ========  =======  =========

12,640 outputs in all. Each output's parse (and each simulator answer) must be
structured: calls are plain JSON (they serialise and encode to UTF-8), errors
are :class:`ParseError` with a known kind, tool messages encode to UTF-8, and
no single example takes more than a few seconds.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slca._limits import json_depth, loads, value_problem
from slca.chat import ERROR_KINDS, get_format, list_formats
from slca.env.llm import LLMSimulator
from slca.env.simulators import PythonSimulator, SchemaSimulator, ToolError
from slca.generation.rollout import answer_turn
from slca.types import ParsedTurn, ParseError, ToolCall, ToolResult

FORMATS = [get_format(n) for n in list_formats()]
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


def fuzz(n: int) -> settings:
    return settings(FUZZ, max_examples=n)
PER_EXAMPLE_S = 5.0  # generous: a loaded 2-core machine; quadratic parsing of these sizes took minutes

# ------------------------------------------------------------------ strategies

SURROGATES = st.characters(categories=["Cs"])
CHARS = st.one_of(st.characters(), SURROGATES, st.sampled_from('<>{}[]"\\:;,/|\n '))
TEXT = st.text(CHARS, max_size=40)
PIECES = st.sampled_from([
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>", '{"name": "get_weather", "arguments": ',
    '{"name": "book", "parameters": ', '"arguments"', '"parameters"', '{"city": "Oslo"}', "}", "{", "[", "]", ";", "; ",
    '"', "\\", '"\\ud800"', '"\\udfff\\ud800"', "\\u", "NaN", "Infinity", "-Infinity", "1e999", "-0", "9" * 4400,
    "[" * 1200, "{\"a\":" * 300, "]" * 700, '{"role": "assistant", "tool_calls": [', '{"function": {"name": "f", "arguments": "',
    '\\"{\\\\\\"a\\\\\\": 1}\\"', "\x00", "\ud800", "\U0001f600", "\u202e", "\ufeff",
])
MIXED = st.lists(st.one_of(PIECES, TEXT), max_size=30).map("".join)

# ``st.characters()`` with no arguments includes lone surrogates (category Cs): hostile values.
# ``VALID_CHARS`` is valid Unicode only, for what must be a JSON-valued call (``value_problem`` is None).
VALID_CHARS = st.characters(codec="utf-8")


def _json(chars: st.SearchStrategy[str]) -> st.SearchStrategy:
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(chars, max_size=20),
        st.sampled_from(["</tool_call>", "<tool_call>", "a\"b\\c\nd", "; {\"name\": \"x\"}", "<|python_tag|>", "</think>"]),
    )
    return st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)), max_leaves=12)


def _calls(chars: st.SearchStrategy[str]) -> st.SearchStrategy[list[ToolCall]]:
    names = st.one_of(
        st.sampled_from(["get_weather", "book_hotel", "lookup"]),
        st.text(chars, min_size=1, max_size=12).filter(lambda s: s.strip()),
        st.sampled_from(['we"ird', "back\\slash", "new\nline", "</tool_call>", "<tool_call>", "{", "name\"}, {\"name\": \"x"]),
    )
    return st.lists(st.builds(ToolCall, names, st.dictionaries(st.text(max_size=8), _json(chars), max_size=4)), min_size=1, max_size=4)


JSON = _json(st.characters())  # strings may hold lone surrogates
CALLS = _calls(st.characters())  # hostile: names and strings may hold lone surrogates (not JSON-valued calls)
VALID_CALLS = _calls(VALID_CHARS)  # JSON-valued calls: what render / parse must round-trip


def _mutate(text: str, data: st.DataObject) -> str:
    """Cut the text somewhere, or splice a hostile piece into it."""
    op = data.draw(st.sampled_from(["cut", "insert", "double", "none"]))
    at = data.draw(st.integers(0, len(text)))
    if op == "cut":
        return text[:at]
    if op == "insert":
        return text[:at] + data.draw(st.one_of(PIECES, TEXT)) + text[at:]
    if op == "double":
        return text[:at] + text
    return text


# ------------------------------------------------------------------ invariants


def _check_turn(turn: ParsedTurn) -> None:
    assert isinstance(turn, ParsedTurn)
    for c in turn.calls:
        assert isinstance(c, ToolCall) and isinstance(c.name, str) and isinstance(c.arguments, dict)
        assert value_problem({"name": c.name, "arguments": c.arguments}) is None
        json.dumps(c.to_openai(), ensure_ascii=False).encode("utf-8")  # what the chat template and tokenizer get
        assert json_depth(json.dumps(c.arguments)) <= 64
    for e in turn.errors:
        assert isinstance(e, ParseError) and e.kind in ERROR_KINDS and isinstance(e.message, str)
        assert len(e.fragment) <= 1000


def _parse_all(text: str) -> list[ParsedTurn]:
    out = []
    for fmt in FORMATS:
        t0 = time.perf_counter()
        turn = fmt.parse(text)
        assert time.perf_counter() - t0 < PER_EXAMPLE_S, (fmt.name, len(text))
        _check_turn(turn)
        out.append(turn)
    return out


def _check_result(r: ToolResult) -> None:
    assert isinstance(r, ToolResult)
    text = r.to_text()
    text.encode("utf-8")
    if r.ok:
        assert value_problem(r.content) is None and len(text) <= 16384
    else:
        assert isinstance(r.error, str) and r.error


# ------------------------------------------------------------------ formats


@fuzz(1200)
@given(MIXED)
def test_formats_never_raise_on_mixed_text(text):
    _parse_all(text)


@fuzz(700)
@given(CALLS, st.data())
def test_formats_never_raise_on_mutated_calls(calls, data):
    fmt = data.draw(st.sampled_from(FORMATS))
    _parse_all(_mutate(fmt.render(calls), data))


@fuzz(120)
@given(
    st.integers(900, 6000), st.sampled_from(["[", '{"a": ', '{"a": [']), st.integers(4000, 20000), st.integers(0, 3000), st.data()
)
def test_formats_bound_deep_and_huge_json(depth, opener, digits, repeats, data):
    closer = {"[": "]", '{"a": ': "}", '{"a": [': "]}"}[opener]
    deep = opener * depth + "1" + closer * data.draw(st.sampled_from([0, depth]))
    body = data.draw(st.sampled_from([
        '{"name": "f", "arguments": {"x": ' + deep + "}}",
        '{"name": "f", "arguments": {"x": ' + "9" * digits + "}}",
        '{"name": "f", "parameters": {"x": ' + deep + "}}",
        '{"tool_calls": [{"function": {"name": "f", "arguments": ' + json.dumps('{"x": ' + deep + "}") + "}}]}",
        "<tool_call>" * repeats,
        '{"name": "f", "parameters": {}}; ' * repeats,
        "</tool_call><tool_call>{" * repeats,
    ]))
    wrapped = data.draw(st.sampled_from(["<tool_call>{}</tool_call>", "<|python_tag|>{}", "{}", "<think>x</think><tool_call>[{}]</tool_call>"]))
    _parse_all(wrapped.replace("{}", body, 1))


def _json_valued(calls: list[ToolCall]) -> bool:
    return all(value_problem({"name": c.name, "arguments": c.arguments}) is None for c in calls)


@fuzz(400)
@given(VALID_CALLS)
@example([ToolCall("get_weather", {"": "\U0001f600 \u202e\ufeff"}), ToolCall("new\nline", {"<tool_call>": ["</tool_call>"]})])
def test_render_parse_round_trip(calls):
    """Names with quotes, backslashes, newlines or tags, and arguments holding literal tags, survive.

    The promise is for JSON-valued calls (the strategy draws valid Unicode only); a lone
    surrogate is refused instead (``test_render_parse_refuses_lone_surrogates``).
    """
    assert _json_valued(calls)
    want = [(c.name, c.arguments) for c in calls]
    for fmt in FORMATS:
        turn = fmt.parse(fmt.render(calls))
        assert [(c.name, c.arguments) for c in turn.calls] == want, fmt.name
        assert [e for e in turn.errors if e.kind != "text_around_calls"] == [], fmt.name


@fuzz(400)
@given(CALLS)
@example([ToolCall("get_weather", {"": "\ud800"})])  # the draw that failed once other modules were loaded (order-dependent)
@example([ToolCall("get_weather", {"city": "Oslo"}), ToolCall("we\udfffird", {}), ToolCall("lookup", {"q": ["\udc00x"]})])
def test_render_parse_refuses_lone_surrogates(calls):
    """Any call, lone surrogates included: parse(render) gives the calls back, or refuses; never a changed call.

    A lone surrogate is not valid Unicode (no UTF-8 encoding, no token ids), so a call
    holding one is not JSON-valued: render writes it as is and parse answers an
    ``invalid_json`` error naming the lone surrogate instead of the call. How much a
    refusal takes with it depends on the format's unit of JSON: the one call (hermes,
    llama3_json) or the whole ``<tool_call>`` list / message (json_list, openai).
    """
    want = [(c.name, c.arguments) for c in calls]
    for fmt in FORMATS:
        turn = fmt.parse(fmt.render(calls))
        got = [(c.name, c.arguments) for c in turn.calls]
        _check_turn(turn)
        errors = [e for e in turn.errors if e.kind != "text_around_calls"]
        if _json_valued(calls):
            assert got == want and errors == [], fmt.name
            continue
        assert errors and all(e.kind == "invalid_json" and "lone surrogate" in e.message for e in errors), (fmt.name, errors)
        rest = iter(want)
        assert all(g in rest for g in got), fmt.name  # the calls that come back are rendered ones, in order, unchanged
        assert len(got) + len(errors) <= len(want), fmt.name
        if fmt.name in ("hermes", "llama3_json"):  # one JSON value per call: exactly the bad calls are refused
            assert got == [w for w, c in zip(want, calls) if _json_valued([c])], fmt.name


# ------------------------------------------------------------------ simulators


def _tool(name, params, response=None, required=()):
    fn = {"name": name, "description": "", "parameters": {"type": "object", "properties": params, "required": list(required)}}
    if response is not None:
        fn["response"] = response
    return {"type": "function", "function": fn}


HOSTILE_TOOLS = [
    _tool("get_weather", {"city": {"type": "string"}}, {"type": "object", "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}}}),
    _tool("f", {"x": {}}),  # anything goes: the model's JSON is echoed back
    _tool("code", {"code": {"type": "string", "pattern": "^(a|aa)+$"}}, {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a|aa)+$"}}}),
    _tool("none_allowed", {"q": {"type": "string"}}, {"type": "object", "properties": {"v": {"enum": []}}}),
    _tool("million", {}, {"type": "array", "minItems": 1000000, "items": {"type": "string"}}),
    _tool("wide", {}, {"type": "array", "minItems": 64, "items": {"type": "array", "minItems": 64, "items": {"type": "string"}}}),
    _tool("long", {}, {"type": "string", "minLength": 10**9}),
    _tool("regex_gen", {}, {"type": "object", "properties": {"a": {"type": "string", "pattern": "^((a{1000}){1000}){1000}$"}}}),
    _tool("book", {"name": {"type": "string"}}, {"type": "object", "properties": {"booking_id": {"type": "string"}}}),
]
TOOL_NAMES = [t["function"]["name"] for t in HOSTILE_TOOLS]
ARGS = st.dictionaries(st.sampled_from(["city", "x", "code", "q", "name", "extra"]), st.one_of(JSON, st.text(CHARS, max_size=60), st.just("a" * 40 + "!")), max_size=3)
FUZZED_CALL = st.one_of(
    st.builds(lambda n, a: f'<tool_call>{{"name": "{n}", "arguments": {a}}}</tool_call>', st.sampled_from(TOOL_NAMES), st.one_of(PIECES, st.builds(lambda d: json.dumps(d, ensure_ascii=False), ARGS))),
    st.builds(lambda n, a: "<tool_call>" + json.dumps({"name": n, "arguments": a}) + "</tool_call>", st.sampled_from(TOOL_NAMES), ARGS),  # \ud800 escapes
    MIXED,
)


def _answer(text, sim):
    turn = FORMATS[list_formats().index("hermes")].parse(text)
    t0 = time.perf_counter()
    results, msgs = answer_turn(turn, sim, episode=0)  # what the rollout does with the turn
    assert time.perf_counter() - t0 < PER_EXAMPLE_S
    for r in results:
        _check_result(r)
    for m in msgs:
        m["content"].encode("utf-8")
    return results


SCHEMA_SIM = SchemaSimulator(HOSTILE_TOOLS, seed=0)


@fuzz(600)
@given(FUZZED_CALL, st.sampled_from(TOOL_NAMES), ARGS)
def test_schema_simulator_on_fuzzed_calls(text, name, args):
    _answer(text, SCHEMA_SIM)
    _check_result(SCHEMA_SIM.call(name, args, episode=1))  # raw arguments (a dataset, another parser): as safe
    SCHEMA_SIM.reset()


def _echo(**kw):
    return kw


class _Weird:
    pass


def _python_functions():
    import datetime
    import decimal

    odd = {0: {1, 2}, 1: datetime.datetime(2025, 1, 1), 2: b"bytes", 3: decimal.Decimal("1.5"), 4: float("nan"), 5: _Weird(), 6: {"k": (1, 2)}, 7: 10**5000}

    def f(x=None):
        if isinstance(x, str) and x.startswith("raise"):
            raise ToolError("the tool refused")
        return odd.get(len(str(x)) % 10, {"x": x})

    def book(name="", state=None):
        state.setdefault("n", 0)
        state["n"] += 1
        return {"booking_id": f"B{state['n']}"}

    return {"get_weather": _echo, "f": f, "code": lambda code="": {"code": code}, "none_allowed": lambda q="": {"v": q},
            "million": lambda: [], "wide": lambda: [["x"] * 64] * 64, "long": lambda: "x" * 100_000, "regex_gen": lambda: {"a": "a"}, "book": book}


PY_SIM = PythonSimulator(HOSTILE_TOOLS, _python_functions(), timeout=2.0)


@fuzz(400)
@given(FUZZED_CALL, st.sampled_from(TOOL_NAMES), ARGS)
def test_python_simulator_on_fuzzed_calls(text, name, args):
    _answer(text, PY_SIM)
    _check_result(PY_SIM.call(name, args, episode=1))
    PY_SIM.reset()


def test_fuzzed_simulators_counted_their_refusals():
    """Each refusal path is a counted, structured result (the fuzz tests above go through them at random)."""
    for name, args in [("code", {"code": "a" * 40 + "!"}), ("f", {"x": "\ud800"}), ("none_allowed", {}), ("million", {}), ("long", {})]:
        SCHEMA_SIM.call(name, args)
        PY_SIM.call(name, args)
    assert SCHEMA_SIM.metrics["invalid_arguments"] > 0 and SCHEMA_SIM.metrics["invalid_output"] > 0
    assert PY_SIM.metrics["invalid_output"] > 0 and PY_SIM.metrics["oversized_output"] > 0


# ------------------------------------------------------------------ LLM simulator (hostile replies over HTTP)


@pytest.fixture(scope="module")
def reply_server():
    box = {"reply": b""}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            raw = box["reply"]
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    box["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield box
    httpd.shutdown()
    httpd.server_close()


@fuzz(60)
@given(st.one_of(MIXED, st.builds(lambda d: json.dumps(d), JSON)), st.booleans(), st.data())
def test_llm_simulator_on_fuzzed_replies(reply_server, content, wrap, data):
    """The simulating LLM's reply is hostile too: content (or the whole envelope) is fuzzed."""
    if wrap:
        raw = json.dumps({"choices": [{"message": {"content": content}}]}).encode("utf-8", "surrogatepass")
    else:
        raw = content.encode("utf-8", "surrogatepass")
    reply_server["reply"] = raw
    sim = LLMSimulator(HOSTILE_TOOLS, base_url=reply_server["url"], model="m", timeout=5.0, max_retries=0, http_attempts=1)
    r = sim.call(data.draw(st.sampled_from(["get_weather", "f"])), {"x": 1} if data.draw(st.booleans()) else {"city": "Oslo"})
    _check_result(r)
    assert sim.metrics["requests"] == 1


# ------------------------------------------------------------------ the bounded decoder itself


@fuzz(300)
@given(st.one_of(MIXED, st.builds(json.dumps, JSON)))
def test_bounded_loads_agrees_with_json_where_json_is_safe(text):
    value, reason = loads(text)
    try:
        ref = json.loads(text)
    except (ValueError, RecursionError):
        assert reason is not None
        return
    if reason is None:
        assert value == ref or value != value  # (NaN never comes back: refused)
    else:  # refused something json accepts: only the documented limits
        assert any(k in reason for k in ("nested", "digits", "not JSON", "out of range", "surrogate")), reason


# ------------------------------------------------------------------ the issue's cases, one by one


def test_python_tool_failures_are_named_and_counted():
    import datetime
    import decimal

    values = {"a_set": {1, 2}, "a_datetime": datetime.datetime(2025, 1, 1), "bytes": b"x", "a_decimal": decimal.Decimal("1.5")}
    tools = [_tool(n, {}) for n in values] + [_tool("strict", {"x": {"type": "integer"}})]
    fns = {n: (lambda v=v: {"value": v}) for n, v in values.items()}
    fns["strict"] = lambda x=0: {"x": x}
    sim = PythonSimulator(tools, fns)
    for n, v in values.items():
        r = sim.call(n, {})
        assert not r.ok and type(v).__name__ in r.error and "['value']" in r.error
    r = sim.call("strict", {"x": 1, "y": 2})  # the schema allows extra keys, the callable does not
    assert not r.ok and "unexpected keyword argument 'y'" in r.error
    assert sim.metrics["invalid_output"] == 4 and sim.metrics["invalid_arguments"] == 1


def test_python_tool_time_limit_main_thread_and_other_threads():
    def stubborn():
        while True:
            try:
                time.sleep(0.01)
            except Exception:  # a tool that swallows everything still stops: the limit is a BaseException
                pass

    def slow():
        time.sleep(1.5)
        return {}

    sim = PythonSimulator([_tool("stubborn", {}), _tool("slow", {})], {"stubborn": stubborn, "slow": slow}, timeout=0.3)
    t0 = time.perf_counter()
    r = sim.call("stubborn", {})
    assert not r.ok and "did not finish within 0.3 s" in r.error and time.perf_counter() - t0 < 3.0
    out = {}
    th = threading.Thread(target=lambda: out.update(r=sim.call("slow", {})))  # no signals here: abandoned instead
    t0 = time.perf_counter()
    th.start()
    th.join(10)
    assert not out["r"].ok and time.perf_counter() - t0 < 1.4
    assert sim.metrics["timeouts"] == 2
    assert PythonSimulator([_tool("slow", {})], {"slow": slow}, timeout=None).call("slow", {}).ok


def test_schema_simulator_hostile_schemas_and_arguments():
    sim = SchemaSimulator(HOSTILE_TOOLS)
    t0 = time.process_time()
    r = sim.call("code", {"code": "a" * 5000 + "!"})  # ^(a|aa)+$ backtracks exponentially on this in `re`
    assert not r.ok and "is refused" in r.error and time.process_time() - t0 < 2.0
    assert sim.call("code", {"code": "aaaa"}).ok
    assert "empty enum" in sim.call("none_allowed", {"q": "x"}).error
    assert "minItems 1000000" in sim.call("million", {}).error
    assert "minLength 1000000000" in sim.call("long", {}).error
    assert "more than 4096 values" in sim.call("wide", {}).error
    r = sim.call("get_weather", {"city": "\ud800"})
    assert not r.ok and "lone surrogate" in r.error
    assert sim.metrics["invalid_arguments"] == 2 and sim.metrics["invalid_output"] == 4
