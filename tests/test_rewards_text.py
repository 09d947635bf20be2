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
