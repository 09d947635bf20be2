"""slca._limits: bounds on untrusted values (JSON from model output or the network, regexes from tool schemas).

Each function returns a reason instead of raising, in time linear in the input. Fuzzed against hostile
model output together with the formats and simulators: test_fuzz.py (test_bounded_loads_agrees_with_json...).
"""

from __future__ import annotations

import datetime
import decimal
import json
import pickle
import re
import time

import pytest

from slca._limits import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    REFUSED_KEYWORDS,
    SRE,
    BoundedValidator,
    PatternTimeout,
    json_depth,
    loads,
    parse_regex,
    pattern_search,
    raw_decode,
    value_problem,
)


def _nested(n: int) -> str:
    return "[" * n + "]" * n


# ------------------------------------------------------------------ json_depth


def test_json_depth_ignores_brackets_in_strings_and_stops_past_the_limit():
    assert json_depth('{"a": [1, 2]}') == 2 and json_depth("3") == 0
    assert json_depth('{"a": "[[[[[[ ]]]"}') == 1  # brackets inside a string are text
    assert json_depth('"unterminated [[[[') == 0  # an unterminated string runs to the end
    assert json_depth("]]][[]") == 2  # an unmatched closer resets the count: the bound holds from any offset
    assert json_depth(_nested(10_000), limit=5) == 6  # stops once the limit is passed
    assert json_depth(_nested(10_000)) == 10_000  # no recursion: any depth is counted


# ------------------------------------------------------------------ loads / raw_decode


@pytest.mark.parametrize("text,value", [
    ('{"a": [1, 2.5, "x", null, true]}', {"a": [1, 2.5, "x", None, True]}),
    (_nested(MAX_DEPTH), json.loads(_nested(MAX_DEPTH))),
    ("9" * 4000, int("9" * 4000)),
    ('"\\u00e9\\ud83d\\ude00"', "\u00e9\U0001f600"),  # a surrogate pair is one character, not a lone surrogate
])
def test_loads_decodes_plain_json(text, value):
    assert loads(text) == (value, None)


@pytest.mark.parametrize("text,reason", [
    (_nested(MAX_DEPTH + 1), f"JSON nested deeper than {MAX_DEPTH} levels"),
    ("9" * (MAX_INT_DIGITS + 1), f"integer with {MAX_INT_DIGITS + 1} digits (more than {MAX_INT_DIGITS})"),
    ("NaN", "NaN is not JSON"),
    ("[Infinity]", "Infinity is not JSON"),
    ("-Infinity", "-Infinity is not JSON"),
    ('{"t": 1e999}', "number 1e999 is out of range"),
    ("{", "Expecting property name enclosed in double quotes at char 1"),
    ("", "Expecting value at char 0"),
    ("[1,]", "Expecting value at char 3"),
])
def test_loads_refuses_with_a_reason_the_model_can_read(text, reason):
    assert loads(text) == (None, reason)


@pytest.mark.parametrize("text", ['"\\ud800"', '{"\\udc00": 1}', '["ok", "\\udfff"]'])
def test_loads_refuses_lone_surrogates(text):
    _, reason = loads(text)
    assert reason is not None and "lone surrogate" in reason


def test_loads_gives_no_value_with_a_reason():
    assert loads('"\\ud800"')[0] is None


def test_an_integer_of_max_int_digits_is_accepted():
    """MAX_INT_DIGITS is the longest accepted, at the edge too (a bound in bits refused 10**4300 - 1)."""
    assert value_problem(10 ** MAX_INT_DIGITS - 1) is None and value_problem(-(10 ** MAX_INT_DIGITS - 1)) is None
    assert "more than 4300 digits" in value_problem(10 ** MAX_INT_DIGITS) and "more than" in value_problem(-(10 ** MAX_INT_DIGITS))
    assert loads("9" * MAX_INT_DIGITS)[1] is None


def test_loads_takes_a_smaller_depth_limit():
    assert loads("[[1]]", max_depth=2) == ([[1]], None)
    assert loads("[[1]]", max_depth=1) == (None, "JSON nested deeper than 1 levels")


def test_raw_decode_reads_one_value_at_an_offset_and_says_where_it_ends():
    assert raw_decode('x {"a": 1} tail', 2) == ({"a": 1}, 10, None)
    assert raw_decode('{"a": ', 0) == (None, 0, "Expecting value at char 6")  # a syntax error: the end is unknown
    # a refused value: its end, so a caller can go on after it
    text = _nested(MAX_DEPTH + 6) + " next"
    assert raw_decode(text, 0) == (None, 2 * (MAX_DEPTH + 6), f"JSON nested deeper than {MAX_DEPTH} levels")
    assert raw_decode("[NaN] rest", 0) == (None, 0, "NaN is not JSON")
    value, end, reason = raw_decode('["\\ud800"] rest', 0)
    assert (value, end) == (None, 10) and "lone surrogate" in reason


# ------------------------------------------------------------------ value_problem


def test_value_problem_accepts_plain_json_values():
    assert value_problem({"a": [1, 2.0, "s", None, True, (1, 2)], "b": {"c": -0.0}}) is None


@pytest.mark.parametrize("value,problem", [
    ({"a": {1, 2}}, "['a'] is a set, not a JSON value"),
    ({"a": [datetime.date(2025, 1, 1)]}, "['a'][0] is a date, not a JSON value"),
    (b"x", "the value is a bytes, not a JSON value"),
    ({"d": decimal.Decimal("1.5")}, "['d'] is a Decimal, not a JSON value"),
    ({"f": float("inf")}, "['f']: inf is not a JSON number"),
    ([float("nan")], "[0]: nan is not a JSON number"),
    ([10 ** 5000], f"[0]: integer with more than {MAX_INT_DIGITS} digits"),
    ({"s": "ok\ud800"}, "['s']: lone surrogate '\\ud800' is not valid Unicode"),
    ({"\ud800": 1}, "the value: key with a lone surrogate is not valid Unicode"),
    ({1: "a"}, "the value: key 1 is a int, not a string"),
])
def test_value_problem_names_what_is_wrong_and_where(value, problem):
    assert value_problem(value).startswith(problem), value_problem(value)


def test_value_problem_depth_and_json_only():
    deep: list = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert value_problem(deep) == f"[0][0][0]...: nested deeper than {MAX_DEPTH} levels"
    assert value_problem(deep, max_depth=MAX_DEPTH + 5) is None
    for _ in range(20_000):  # iterative: no RecursionError however deep
        deep = [deep]
    assert "nested deeper" in value_problem(deep)
    # json_only: a value json itself decoded (its types are right; its numbers and strings are still checked)
    assert value_problem({1: {2, 3}}, json_only=True) is None
    assert value_problem([float("nan")], json_only=True) == "[0]: nan is not a JSON number"


# ------------------------------------------------------------------ regexes under a time limit


def test_pattern_search_is_re_search():
    assert pattern_search("^a+$", "aaa") and not pattern_search("^a+$", "aab")
    assert pattern_search("b", "abc")  # search, not match


def test_pattern_search_stops_catastrophic_backtracking():
    t0 = time.perf_counter()
    with pytest.raises(PatternTimeout, match=r"takes more than 50 ms"):
        pattern_search("^(a|aa)+$", "a" * 5000 + "!")
    assert time.perf_counter() - t0 < 2.0  # in `re` this runs for longer than the universe has


def test_pattern_search_refuses_a_pattern_too_large_to_compile_in_bounded_time():
    with pytest.raises(PatternTimeout, match="too large to match under a time limit"):
        pattern_search("^((a{1000}){1000}){1000}$", "a")


def test_parse_regex_is_the_stdlib_parse_tree():
    assert [op for op, _ in parse_regex("ab")] == [SRE.LITERAL, SRE.LITERAL]  # opcodes are SRE's
    ((op, (lo, hi, _)),) = parse_regex("x{2,5}")
    assert op is SRE.MAX_REPEAT and (lo, hi) == (2, 5)
    with pytest.raises(re.error):
        parse_regex("(")


def test_bounded_validator_refuses_a_value_its_pattern_cannot_match_in_time():
    v = BoundedValidator({"type": "string", "pattern": "^(a|aa)+$"})
    assert v.is_valid("aa") and not v.is_valid("ab") and not v.is_valid(3)
    (err,) = list(v.iter_errors("a" * 3000 + "!"))
    assert "is refused" in err.message and "takes more than 50 ms" in err.message
    assert [e.message for e in v.iter_errors("ab")] == ["'ab' does not match '^(a|aa)+$'"]


def test_bounded_validator_class_pickles_by_name_and_refused_keywords():
    assert pickle.loads(pickle.dumps(BoundedValidator)) is BoundedValidator
    assert "patternProperties" in REFUSED_KEYWORDS


# ------------------------------------------------------------------ BoundedValidator: jsonschema's Draft 2020-12, pattern bounded


UNEVALUATED_CASES = [  # (schema, instances): BoundedValidator agrees with jsonschema (it replaces only `pattern`)
    ({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}, [{"a": 1}, {"a": 1, "b": 2}, {}]),
    ({"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": {"type": "string"}}, [{"a": 1, "b": "s"}, {"a": 1, "b": 2}]),
    ({"anyOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]}, {"properties": {"b": {}}}], "unevaluatedProperties": False},
     [{"a": 1}, {"a": 2}, {"b": 0}, {"a": 1, "b": 0, "c": 0}]),
    ({"if": {"properties": {"k": {"const": "p"}}, "required": ["k"]}, "then": {"properties": {"p": {}}},
      "else": {"properties": {"q": {}}}, "properties": {"k": {}}, "unevaluatedProperties": False},
     [{"k": "p", "p": 1}, {"k": "p", "q": 1}, {"k": "z", "q": 1}, {"k": "z", "p": 1}]),
    ({"$defs": {"base": {"properties": {"a": {}}}}, "$ref": "#/$defs/base", "unevaluatedProperties": False}, [{"a": 1}, {"a": 1, "b": 1}]),
    ({"dependentSchemas": {"a": {"properties": {"b": {}}}}, "properties": {"a": {}}, "unevaluatedProperties": False},
     [{"a": 1, "b": 1}, {"b": 1}, {"a": 1, "c": 1}]),
    ({"additionalProperties": {"type": "integer"}, "unevaluatedProperties": False}, [{"z": 1}, {"z": "s"}]),
    ({"properties": {"s": {"type": "string", "pattern": "^a+$"}}, "additionalProperties": False}, [{"s": "aa"}, {"s": "ab"}, {"t": 1}]),
]


@pytest.mark.parametrize("schema,instances", UNEVALUATED_CASES)
def test_bounded_validator_agrees_with_jsonschema(schema, instances):
    from jsonschema import Draft202012Validator

    from slca._limits import BoundedValidator

    ours, theirs = BoundedValidator(schema), Draft202012Validator(schema)
    for inst in instances:
        assert ours.is_valid(inst) == theirs.is_valid(inst), inst
        assert [e.message for e in ours.iter_errors(inst)] == [e.message for e in theirs.iter_errors(inst)], inst

