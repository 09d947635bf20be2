"""slca.env.schema: tool names and schemas checked when a tool is loaded, arguments and responses validated.

Schemas arriving in dataset rows (file, row, field named): test_loaders.py; the simulators' own refusals:
test_env_simulators.py and test_fuzz.py.
"""

from __future__ import annotations

import re
import time

import pytest

from slca.env import SchemaSimulator
from slca.env.schema import (
    MAX_DEPTH,
    MAX_NAME_LENGTH,
    ToolBox,
    as_tool_specs,
    check_tool,
    check_tool_name,
    check_tool_schema,
    nesting_depth,
)
from slca.types import ToolSpec


def tool(name="f", parameters=None, **fn):
    f = {"name": name, "parameters": parameters if parameters is not None else {"type": "object", "properties": {"x": {"type": "string"}}}}
    f.update(fn)
    return {"type": "function", "function": f}


def _nested(n):
    schema = {"type": "object"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# ------------------------------------------------------------------ tool names


@pytest.mark.parametrize("name", ["get_weather", "weather-mcp-get_weather", "Get Weather!", "v1.search", "погода", "a" * MAX_NAME_LENGTH])
def test_usable_tool_names_are_accepted(name):
    check_tool_name(name)


@pytest.mark.parametrize("name,needle", [
    ("", "must be a non-empty string"),
    (None, "must be a non-empty string"),
    (3, "must be a non-empty string"),
    ("a" * (MAX_NAME_LENGTH + 1), f"is {MAX_NAME_LENGTH + 1} characters, more than {MAX_NAME_LENGTH}"),
    (" padded", "leading or trailing whitespace"),
    ("padded\t", "leading or trailing whitespace"),
    ("web\nsearch", r"contains the character '\\n'"),
    ("zero\u200bwidth", r"contains the character '\\u200b'"),
    ("line\u2028sep", r"contains the character '\\u2028'"),
    ("<script>", "contains the character '<'"),
    ("a>b", "contains the character '>'"),
])
def test_unusable_tool_names_are_refused_saying_why(name, needle):
    with pytest.raises(ValueError, match=needle):
        check_tool_name(name)


# ------------------------------------------------------------------ nesting_depth


def test_nesting_depth_counts_lists_and_objects_without_recursion():
    assert [nesting_depth(v) for v in (3, "s", [], {}, [1, [2]], {"a": [1, {"b": 2}]})] == [0, 0, 1, 1, 2, 3]
    deep: list = []
    for _ in range(20_000):  # far past Python's recursion limit
        deep = [deep]
    assert MAX_DEPTH < nesting_depth(deep) <= MAX_DEPTH + 1  # stops once deep enough to refuse


# ------------------------------------------------------------------ check_tool / check_tool_schema / as_tool_specs


def test_check_tool_returns_the_checked_spec():
    spec = check_tool(tool("book", description="books a room", response={"type": "object"}, **{"x-stateful": True, "x-domain": "travel"}))
    assert isinstance(spec, ToolSpec)
    assert (spec.name, spec.description, spec.stateful, spec.domain) == ("book", "books a room", True, "travel")
    assert spec.response == {"type": "object"}
    assert check_tool({"name": "flat", "parameters": {"type": "object"}}).name == "flat"  # a bare function dict too


@pytest.mark.parametrize("bad,needle", [
    (tool(description=3), "tool 'f': description must be a string, got int"),
    (tool(parameters=[]), "tool 'f': parameters must be a JSON Schema object, got list"),
    (tool(response="text"), "tool 'f': response must be a JSON Schema object, got str"),
    (tool(**{"x-stateful": "false"}), "tool 'f': x-stateful must be a bool, got 'false'"),  # not read as True
    (tool(**{"x-domain": 3}), "tool 'f': x-domain must be a str"),
    ({"type": "function", "function": "f"}, "'function' must be an object, got str"),
    (tool("bad name\n"), "leading or trailing whitespace"),
    (tool(parameters={"type": "array"}), "tool 'f': parameters must have type 'object', got 'array'"),
    (tool(parameters={"type": "object", "properties": {"x": {"type": "strnig"}}}), "tool 'f': invalid parameters schema"),
    (tool(parameters={"type": "object", "properties": {"x": {"minimum": float("nan")}}}), "tool 'f': invalid parameters schema"),
    (tool(parameters=_nested(MAX_DEPTH + 5)), f"tool 'f': parameters schema is nested deeper than {MAX_DEPTH} levels"),
    (tool(response={"type": "object", "properties": {"a": {"minimum": "zero"}}}), "tool 'f': invalid response schema"),
])
def test_check_tool_refuses_naming_the_tool_and_the_problem(bad, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        check_tool(bad)


def test_check_tool_schema_checks_a_spec_built_by_hand():
    check_tool_schema(ToolSpec(name="f", description="", parameters={}))  # no type: an object
    with pytest.raises(ValueError, match="tool 'f': parameters must be a JSON Schema object, got list"):
        check_tool_schema(ToolSpec(name="f", description="", parameters=[]))
    with pytest.raises(ValueError, match="tool name"):
        check_tool_schema(ToolSpec(name="", description="", parameters={}))


def test_as_tool_specs_takes_dicts_and_specs_and_names_the_bad_entry():
    spec = check_tool(tool("f"))
    assert [s.name for s in as_tool_specs([spec, tool("g")])] == ["f", "g"]
    with pytest.raises(ValueError, match=r"^tools\[1\]: must be an OpenAI tool dict or a ToolSpec, got str$"):
        as_tool_specs([spec, "g"])
    with pytest.raises(ValueError, match=r"^tools\[1\]: tool 'g': description must be a string"):
        as_tool_specs([tool("f"), tool("g", description=1)])
    with pytest.raises(ValueError, match=r"^tools: duplicate tool names \['f'\]$"):
        as_tool_specs([tool("f"), spec])


# ------------------------------------------------------------------ $ref: inside the schema only


@pytest.mark.parametrize("ref,needle", [
    ("http://127.0.0.1:9/x.json", "points outside the schema"),
    ("file:///etc/passwd", "points outside the schema"),
    ("other.json#/a", "points outside the schema"),
    ("#/$defs/Nowhere", "does not resolve inside the schema"),
])
def test_refs_that_leave_the_schema_or_point_nowhere_are_refused(ref, needle):
    schema = {"type": "object", "$defs": {"N": {"type": "integer"}}, "properties": {"x": {"$ref": ref}}}
    with pytest.raises(ValueError, match=rf"tool 'r': invalid parameters schema: \$ref {re.escape(repr(ref))} {needle}"):
        ToolBox([tool("r", schema)])


def test_local_refs_resolve():
    box = ToolBox([tool("r", {"type": "object", "$defs": {"N": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/N"}}})])
    assert box.argument_error("r", {"x": 1}) is None
    assert box.argument_error("r", {"x": "one"}) == "invalid arguments for 'r': 'one' is not of type 'integer' (at 'x')"


# ------------------------------------------------------------------ patternProperties (regexes jsonschema would run unbounded)


@pytest.mark.parametrize("where,schema", [
    ("/", {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "integer"}}, "unevaluatedProperties": False}),
    ("/properties/opts", {"type": "object", "properties": {"opts": {"type": "object", "patternProperties": {"^x": {}}}}}),
    ("/anyOf/1", {"type": "object", "anyOf": [{}, {"patternProperties": {"^x": {}}}]}),
    ("/$defs/m", {"type": "object", "$defs": {"m": {"patternProperties": {"^x": {}}}}, "properties": {"a": {"$ref": "#/$defs/m"}}}),
])
def test_pattern_properties_refused_when_a_tool_is_loaded(where, schema):
    """jsonschema matches patternProperties keys with an unbounded re.search (also inside additionalProperties and
    unevaluatedProperties), so a schema that uses the keyword is refused at load time, naming where."""
    with pytest.raises(ValueError, match=rf"tool 'f': invalid parameters schema: patternProperties at {re.escape(where)} is not supported"):
        ToolBox([{"type": "function", "function": {"name": "f", "parameters": schema}}])
    with pytest.raises(ValueError, match="tool 'f': invalid response schema: patternProperties"):
        SchemaSimulator([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "response": schema}}])


def test_pattern_properties_as_a_name_or_data_is_not_the_keyword():
    """A property called ``patternProperties`` and a ``const`` / ``enum`` holding the word are accepted."""
    schema = {"type": "object", "properties": {"patternProperties": {"type": "string", "enum": ["patternProperties"]},
                                               "c": {"const": {"patternProperties": {}}}}}
    box = ToolBox([{"type": "function", "function": {"name": "f", "parameters": schema}}])
    assert box.argument_error("f", {"patternProperties": "patternProperties"}) is None


# ------------------------------------------------------------------ ToolBox


@pytest.fixture(scope="module")
def box():
    return ToolBox([
        tool("book", {"type": "object", "required": ["date"], "properties": {
            "date": {"type": "string", "format": "date"}, "nights": {"type": "array", "items": {"type": "integer"}},
            "code": {"type": "string", "pattern": "^(a|aa)+$"}}},
             response={"type": "object", "required": ["booking_id"]}),
        tool("ping"),
    ])


def test_toolbox_names_in_order(box):
    assert box.names == ["book", "ping"] and set(box.specs) == {"book", "ping"}


def test_argument_error_is_none_for_a_valid_call_and_a_readable_message_otherwise(box):
    assert box.argument_error("book", {"date": "2025-07-16", "nights": [1, 2]}) is None
    assert box.argument_error("nope", {}) == "unknown tool 'nope'; available tools: book, ping"
    assert box.argument_error("book", ["2025-07-16"]) == "arguments for 'book' must be a JSON object, got list"
    assert box.argument_error("book", {}) == "invalid arguments for 'book': 'date' is a required property"
    # formats are enforced (FormatChecker), and the message says where
    assert box.argument_error("book", {"date": "2025-13-45"}) == "invalid arguments for 'book': '2025-13-45' is not a 'date' (at 'date')"
    assert box.argument_error("book", {"date": "2025-07-16", "nights": [1, "two"]}).endswith("(at 'nights/1')")


def test_a_pattern_that_would_backtrack_for_minutes_refuses_the_value_in_bounded_time(box):
    t0 = time.process_time()
    err = box.argument_error("book", {"date": "2025-07-16", "code": "a" * 5000 + "!"})
    assert "is refused" in err and "(at 'code')" in err and time.process_time() - t0 < 2.0
    assert box.argument_error("book", {"date": "2025-07-16", "code": "aaa"}) is None


def test_response_error_checks_the_response_schema_when_there_is_one(box):
    assert box.response_error("book", {"booking_id": "B1"}) is None
    assert box.response_error("book", {}) == "'booking_id' is a required property"
    assert box.response_error("ping", "anything at all") is None  # no response schema: nothing to check
    assert box.response_error("nope", {}) is None


def test_a_value_too_deep_to_validate_is_an_error_not_an_exception():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    box = ToolBox([tool("any", {"type": "object", "properties": {"x": {"type": "array", "items": {"$ref": "#/properties/x"}}}})])
    assert box.argument_error("any", {"x": deep}) == "invalid arguments for 'any': the value is nested too deeply to validate"
