"""Issue 44 item 3: your own reward function in slca train (``reward='module:function'``, slca.rewards.batch.user_reward)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_python_tools import EXAMPLE, slca  # noqa: F401

from slca.rewards.batch import reward_problem, score_batch, user_reward
from slca.types import ParsedTurn, Task, ToolCall, ToolResult, Trajectory, Turn


def traj(calls, ok=True, final="It is sunny and 18 degrees in Paris."):
    task = Task("weather-0", [{"role": "user", "content": "Weather in Paris?"}], [], gold=[[ToolCall("get_weather", {"city": "Paris"})]],
                answer_facts=["sunny", "18"])
    turns = [Turn("", ParsedTurn(calls=calls), [ToolResult(ok, "{}") for _ in calls])] if calls else []
    turns.append(Turn(final, ParsedTurn(content=final)))
    return Trajectory(task, [1], [2], [1], [0.0], turns, final, "final_answer")


def write(tmp_path: Path, body: str) -> str:
    (tmp_path / "r.py").write_text(body)
    return str(tmp_path / "r.py")


def test_the_example_reward_scores_both_tiers():
    ref = f"{EXAMPLE / 'rewards.py'}:reward"
    sb = score_batch([traj([ToolCall("get_weather", {"city": "Paris"})]), traj([ToolCall("get_weather", {"city": "Rome"})], final="No idea."),
                      traj([ToolCall("get_weather", {"city": "Paris"})], ok=False)], reward=ref)
    assert sb.tool.tolist() == [1.0, 0.0, 0.0] and sb.summary.tolist() == [1.0, 0.0, 1.0] and not sb.reasons


def test_none_is_an_unscored_tier_with_its_reason_and_bad_answers_are_named(tmp_path):
    f = write(tmp_path, "def none(t):\n    return 1.0, None\n"
                        "def text(t):\n    return 'high', 0.0\n"
                        "def nan(t):\n    return float('nan'), 0.0\n"
                        "def flag(t):\n    return True, 0.0\n"
                        "def one(t):\n    return 1.0\n"
                        "def boom(t):\n    raise KeyError('facts')\n")
    sb = score_batch([traj([])], reward=f"{f}:none")
    assert sb.tool.tolist() == [1.0] and math.isnan(float(sb.summary[0]))
    assert sb.reasons == [f"weather-0: reward '{f}:none' returned None for the summary tier"]
    for name, words in (("text", "returned 'high' as the execution reward of task 'weather-0'"),
                        ("nan", "returned nan as the execution reward"), ("flag", "returned True"),
                        ("one", "returned float for task 'weather-0': give a pair (execution, summary)")):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            score_batch([traj([])], reward=f"{f}:{name}")
    with pytest.raises(RuntimeError, match=r"reward '.*:boom' raised on task 'weather-0': KeyError: 'facts'"):
        score_batch([traj([])], reward=f"{f}:boom")


def test_a_bad_reference_is_refused_in_one_line_before_a_model_loads(tmp_path):
    f = write(tmp_path, "def ok(t):\n    return 0.0, 0.0\n")
    assert reward_problem("slca") is None and reward_problem(f"{f}:ok") is None
    assert reward_problem(f"{f}:missing") == f"{f!r} has no function 'missing'"
    assert reward_problem("slcaa").startswith("one of ['slca', 'paper'], or your function")
    assert reward_problem("no_such_pkg.rewards:fn").startswith("cannot import 'no_such_pkg'")
    assert callable(user_reward(f"{f}:ok"))
    r = slca("train", "--set", f"reward={f}:missing", "--set", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert [ln for ln in r.stderr.splitlines() if ln.strip()][-1].startswith(f"error: reward: {f!r} has no function 'missing'")
    assert not (tmp_path / "run").exists()
