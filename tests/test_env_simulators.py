"""Simulator backends: schema-guided and Python callables (the LLM one: test_env_llm.py)."""

from __future__ import annotations

import json
import logging

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from slca.env import PythonSimulator, SchemaSimulator, Simulator, ToolError
from slca.env.simulators import new_tool_run


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


def test_python_backend_checks_output_and_reports_a_raising_tool_with_one_traceback(caplog):
    """A bug in a tool: the model reads an error result naming the exception; the run logs the first traceback once."""
    sim = PythonSimulator([HOTEL, LOOKUP], {"book_hotel": lambda city, nights: {"booking_id": 1}, "get_booking": lambda booking_id: 1 / 0})
    r = sim.call("book_hotel", {"city": "Rome", "nights": 2})
    assert not r.ok and "violates its response schema" in r.error and sim.metrics["invalid_output"] == 1
    new_tool_run()
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        results = [sim.call("get_booking", {"booking_id": b}, episode=e) for e, b in enumerate("xyz")]
    assert all(not r.ok and r.error == "get_booking raised ZeroDivisionError: division by zero" for r in results)
    assert sim.metrics["tool_raised"] == 3 and sim.metrics["tool_error"] == 0
    logged = [rec for rec in caplog.records if rec.name == "slca.env"]
    assert len(logged) == 1 and logged[0].exc_info[0] is ZeroDivisionError and "'get_booking'" in logged[0].getMessage()
    with pytest.raises(ValueError, match="no implementation"):
        PythonSimulator([HOTEL], {})


# ------------------------------------------------------------------ schema backend: patterns, refs, toolworld


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


def test_a_string_shorter_than_its_min_length_is_padded_and_one_longer_than_its_max_cut():
    tool = fn("code", {}, [], {"type": "object", "required": ["long", "short"],
                              "properties": {"long": {"type": "string", "minLength": 40}, "short": {"type": "string", "maxLength": 2}}})
    for seed in range(5):
        r = SchemaSimulator([tool], seed=seed).call("code", {})
        assert r.ok and len(r.content["long"]) >= 40 and len(r.content["short"]) <= 2, r


def test_a_tool_call_the_ending_interpreter_cannot_start_is_not_the_tools_error(monkeypatch):
    """Off the main thread a call runs in a worker thread; when the interpreter is shutting down no thread can start
    (a signal ended the process during a rollout): the simulator raises past its tool-error handling instead of
    answering the model with an error the tool never made."""
    import concurrent.futures
    import threading

    import slca.env.simulators as S

    def refuse(self, *a, **kw):
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(concurrent.futures.ThreadPoolExecutor, "submit", refuse)
    sim = PythonSimulator([fn("ping", {}, [])], {"ping": lambda: {"ok": True}}, timeout=5.0)
    raised = []

    def call():
        try:
            sim.call("ping", {})
        except S._ToolNotRun as e:
            raised.append(str(e))

    t = threading.Thread(target=call)
    t.start()
    t.join(timeout=30)
    assert raised == ["cannot schedule new futures after interpreter shutdown"]
    assert sim.metrics.get("tool_raised", 0) == 0 and sim.metrics.get("tool_error", 0) == 0
