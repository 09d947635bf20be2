"""Rewards on whole model texts: parsed by the chat formats, executed in the toolworld env."""

from __future__ import annotations

import pytest

from slca.chat import get_format
from slca.env import toolworld as tw
from slca.rewards import execution_reward, in_domain_metrics, summary_reward
from slca.types import ToolResult, Turn

TASKS = tw.make_tasks("train", n=300, seed=2)


def play(task, texts, fmt):
    """Parse each assistant text, execute its calls (one result per call, then one per parse error)."""
    env, turns = tw.make_env(task), []
    for text in texts:
        parsed = fmt.parse(text)
        results = [env.call(c.name, c.arguments) for c in parsed.calls]
        results += [ToolResult(ok=False, error=e.message) for e in parsed.errors if e.kind != "text_around_calls"]
        turns.append(Turn(text=text, parsed=parsed, results=results))
    return turns


@pytest.mark.parametrize("name", ["hermes", "json_list"])
def test_diagnostic_case_from_text(name):
    fmt = get_format(name)
    t = next(t for t in TASKS if t.kind == "parallel")
    a, b = t.gold[0]
    good, poor = t.reference_answer, "Here you go."
    seq = play(t, [fmt.render([a]), fmt.render([b]), good], fmt)
    par = play(t, [fmt.render([a, b]), poor], fmt)
    assert execution_reward(t, seq).total < execution_reward(t, par).total == pytest.approx(1.0)
    assert summary_reward(t, seq, good).total > summary_reward(t, par, poor).total


@pytest.mark.parametrize("name", ["hermes", "json_list"])
def test_malformed_text_then_recovery(name):
    fmt = get_format(name)
    t = next(t for t in TASKS if t.kind == "single")
    broken = '<tool_call>\n{"name": "' + t.gold[0][0].name + '", "arguments": {\n</tool_call>'
    turns = play(t, [broken, fmt.render(t.gold[0]), t.reference_answer], fmt)
    r = execution_reward(t, turns)
    assert r.components["format"] == 0.5 and r.components["efficiency"] == 0.5
    assert in_domain_metrics(t, turns)["success"] == 1.0


def test_scoring_an_openai_message_list():
    from slca.rewards import turns_from_messages

    t = next(t for t in TASKS if t.kind == "chain")
    env = tw.make_env(t)
    msgs = list(t.messages)
    for i, step in enumerate(t.gold):
        msgs.append({"role": "assistant", "content": "", "tool_calls": [c.to_openai(j) for j, c in enumerate(step)]})
        msgs += [{"role": "tool", "tool_call_id": f"call_{j}", "content": env.call(c.name, c.arguments).to_text()} for j, c in enumerate(step)]
    msgs.append({"role": "assistant", "content": t.reference_answer})
    turns, final = turns_from_messages(msgs)
    assert final == t.reference_answer and len(turns) == len(t.gold) + 1
    assert execution_reward(t, turns).total == pytest.approx(1.0)
    assert summary_reward(t, turns, final).total == pytest.approx(1.0)
    # a failed call and malformed arguments are read back as such
    bad = t.messages + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "x", "arguments": "{oops"}},
                                                            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": '{"error": "invalid arguments"}'},
    ]
    turns, final = turns_from_messages(bad)
    assert final == "" and turns[0].parsed.errors[0].kind == "invalid_json"
    assert turns[0].results == [ToolResult(ok=False, error="invalid arguments")]
    assert execution_reward(t, turns).components["format"] == 0.0
