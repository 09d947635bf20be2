"""The shared field readers (slca.env.rows.fields), as a property over every format: a row loads with the gold it
was written with, or is refused naming its row and field."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slca.env import load_tasks
from slca.env.loaders import RowError
from slca.types import ToolCall


# ---------------------------------------------------------------- property: same gold, or refused with row and field


NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
SCALARS = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=8), st.booleans(), st.floats(allow_nan=False, allow_infinity=False, width=32))


@st.composite
def sources(draw):
    """A task (tools with typed parameters, gold calls valid against them) and its row in one of the three formats."""
    n_tools = draw(st.integers(1, 3))
    tool_names = draw(st.lists(NAMES, min_size=n_tools, max_size=n_tools, unique=True))
    tools, arg_types = [], {}
    for name in tool_names:
        props = draw(st.dictionaries(NAMES, st.sampled_from(["integer", "string", "boolean", "number"]), max_size=3))
        arg_types[name] = props
        tools.append({"type": "function", "function": {"name": name, "description": "d",
                                                       "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}}})
    gen = {"integer": st.integers(-10**6, 10**6), "string": st.text(max_size=8), "boolean": st.booleans(),
           "number": st.floats(allow_nan=False, allow_infinity=False, width=32)}
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        step = []
        for _ in range(draw(st.integers(1, 2))):
            name = draw(st.sampled_from(tool_names))
            args = {k: draw(gen[v]) for k, v in arg_types[name].items() if draw(st.booleans())}
            step.append({"name": name, "arguments": args})
        steps.append(step)
    fmt = draw(st.sampled_from(["toucan", "verl", "slca"]))
    user = draw(st.text(min_size=1, max_size=20))
    if fmt == "toucan":
        msgs = [{"role": "user", "content": user}]
        for step in steps:
            msgs += [{"role": "assistant", "content": "", "function_call": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for c in step]
            msgs += [{"role": "function", "name": c["name"], "content": "{}"} for c in step]
        msgs.append({"role": "assistant", "content": "done"})
        row = {"uuid": "u", "subset_name": "single-turn-original", "messages": json.dumps(msgs), "available_tools": json.dumps(tools),
               "target_tools": ", ".join(tool_names)}
    elif fmt == "verl":
        row = {"prompt": [{"role": "user", "content": user}], "tools": json.dumps(tools),
               "reward_model": {"ground_truth": json.dumps({"gold_tool_calls": steps})}, "extra_info": {"index": 0}}
    else:
        row = {"id": "s", "messages": json.dumps([{"role": "user", "content": user}]), "tools": json.dumps(tools), "gold": json.dumps(steps)}
    return row, [[ToolCall(c["name"], c["arguments"]) for c in s] for s in steps]


def _mutate(row, draw):
    """Damage one column: drop it, replace it by a random scalar, truncate its JSON, or wrap it in a list."""
    col = draw(st.sampled_from(sorted(row)))
    how = draw(st.sampled_from(["drop", "scalar", "truncate", "wrap"]))
    row = dict(row)
    if how == "drop":
        del row[col]
    elif how == "scalar":
        row[col] = draw(SCALARS)
    elif how == "truncate":
        text = row[col] if isinstance(row[col], str) else json.dumps(row[col])
        row[col] = text[: draw(st.integers(0, max(0, len(text) - 1)))]
    else:
        row[col] = [row[col]]
    return row, col


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=sources(), data=st.data())
def test_rows_load_with_their_gold_or_are_refused_naming_row_and_field(src, data):
    row, gold = src
    (task,) = load_tasks([row])
    assert task.gold == gold  # the untouched row loads with the gold it was made from
    bad, col = _mutate(row, data.draw)
    try:
        (t,) = load_tasks([bad])  # the list is the source; the row is row 0
    except RowError as e:
        assert e.source == "rows" and e.row == 0 and str(e).startswith("rows row 0")
        assert e.field or "format" in e.problem, str(e)  # a field is named, or the row's format cannot be told
        if e.field:
            assert f"field {e.field!r}" in str(e)
    else:
        assert t.gold == gold, (col, bad)  # harmless damage (e.g. an optional column): still the same gold
