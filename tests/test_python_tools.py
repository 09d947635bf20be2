"""Issue 44 item 3: your own Python tool functions as the suite of ``slca train`` (slca.env.python_tools).

What the user runs (``slca train --set tools=...``, a script of theirs) runs as a real process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transformers.utils import get_json_schema

from slca.env.loaders import RowError
from slca.env.python_tools import load_python_tasks, load_tool_functions, tool_schemas
from slca.env.simulators import exception_result

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "python_tools"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}

STATEFUL = '''
def add_note(text: str, state: dict) -> dict:
    """Add a note to the episode's notebook.

    Args:
        text: The note.
        state: The episode's state (slca passes it; the model never sees it).
    """
    state.setdefault("notes", []).append(text)
    return {"notes": len(state["notes"])}


def broken(city: str) -> dict:
    """A tool with a bug.

    Args:
        city: The city name.
    """
    raise RuntimeError(f"station {city} offline")


def _helper(x: int) -> int:
    return x
'''


def slca(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slca.cli", *args], capture_output=True, text=True, timeout=600, env=ENV, cwd=cwd)


def test_schemas_come_from_signatures_and_docstrings_as_trl_builds_them(tmp_path):
    functions = load_tool_functions(str(EXAMPLE / "tools.py"))
    assert list(functions) == ["get_weather", "convert_temperature"]  # public functions of the module, in order
    trl = [get_json_schema(f) for f in functions.values()]  # what TRL offers the model
    for t in trl:
        t["function"].pop("return")  # the result's type, which slca does not check: it is left out
    assert tool_schemas(functions) == trl
    (tmp_path / "notes.py").write_text(STATEFUL)
    notes = load_tool_functions(f"{tmp_path / 'notes.py'}")
    assert list(notes) == ["add_note", "broken"]  # _helper is not a tool
    params = tool_schemas(notes)[0]["function"]["parameters"]
    assert params["properties"].keys() == {"text"} and params["required"] == ["text"]  # the state parameter is not shown
    with pytest.raises(ValueError, match="has no list 'TOOLS_X' of tool functions"):
        load_tool_functions(f"{tmp_path / 'notes.py'}:TOOLS_X")

    def untyped(x):
        """No type hint."""

    with pytest.raises(ValueError, match="tool 'untyped': cannot build its schema .*missing a type hint"):
        tool_schemas({"untyped": untyped})


def test_task_rows_take_their_tools_from_the_functions(tmp_path):
    functions = load_tool_functions(str(EXAMPLE / "tools.py"))
    tasks = load_python_tasks(EXAMPLE / "tasks.jsonl", functions)
    assert {t["function"]["name"] for t in tasks[0].tools} == {"get_weather", "convert_temperature"}  # no 'tools': all
    assert [t["function"]["name"] for t in tasks[-1].tools] == ["convert_temperature"]  # a row naming a subset
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "messages": [{"role": "user", "content": "hi"}], "gold": [], "tools": ["nope"]}) + "\n")
    with pytest.raises(RowError, match=r"bad.jsonl row 0: field 'tools': \['nope'\] are not among the tool functions"):
        load_python_tasks(bad, functions)


def test_a_raising_tool_gives_the_model_an_error_result_and_logs_one_traceback(tmp_path):
    """As a user's script meets it: three calls of a tool with a bug, one logged traceback, the run goes on."""
    (tmp_path / "notes.py").write_text(STATEFUL)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "messages": [{"role": "user", "content": "Weather?"}], "gold": []}) + "\n")
    script = textwrap.dedent(f"""
        import logging
        from slca.env.suites import load_suite
        logging.basicConfig(level=logging.WARNING)
        tasks, make_env = load_suite({str(tasks)!r}, "train", 0, tools={str(tmp_path / 'notes.py')!r})
        env = make_env(tasks[0])
        for city in ("Paris", "Oslo", "Lima"):
            print(env.call("broken", {{"city": city}}).to_text())
        print(env.call("add_note", {{"text": "a"}}).to_text(), env.call("add_note", {{"text": "b"}}).to_text())
        print(dict(env.metrics))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    assert out[:3] == [json.dumps({"error": f"broken raised RuntimeError: station {c} offline"}) for c in ("Paris", "Oslo", "Lima")]
    assert out[3] == '{"notes": 1} {"notes": 2}'  # a state parameter gets the episode's state
    assert "'tool_raised': 3" in out[4]
    assert r.stderr.count("Traceback (most recent call last)") == 1 and "RuntimeError: station Paris offline" in r.stderr
    # TRL's host words the same exception the same way (SLCAGRPOTrainer wraps its tools with it)
    assert exception_result("broken", RuntimeError("station Paris offline")).to_text() == out[0]


def test_slca_train_refuses_bad_tools_in_one_line_before_a_model_loads(tmp_path):
    suite = str(EXAMPLE / "tasks.jsonl")
    cases = [
        (["--set", "tools=no_such_pkg.tools", "--set", f"suite={suite}"],
         "tools: cannot import 'no_such_pkg' (give a .py file, or put the package on PYTHONPATH / install it)"),
        (["--set", f"tools={EXAMPLE / 'tools.py'}"],
         "tools: your own tool functions need a task file as the suite (--set suite=tasks.jsonl), not 'toolworld'"),
    ]
    for args, line in cases:
        r = slca("train", *args, "--set", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert [ln for ln in r.stderr.splitlines() if ln.strip()][-1] == f"error: {line}"
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_slca_train_runs_the_example_with_your_own_tools(tmp_path):
    run = tmp_path / "run"
    r = slca("train", "--set", f"suite={EXAMPLE / 'tasks.jsonl'}", "--set", f"tools={EXAMPLE / 'tools.py'}",
             "--set", f"reward={EXAMPLE / 'rewards.py'}:reward",
             "--set", "eval_fraction=0.25", "--set", "steps=1", "--set", "tasks_per_step=2", "--set", "group_size=2",
             "--set", "minibatches=1", "--set", "eval_tasks=2", "--set", "report_to=none", "--set", f"run_dir={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    stored = json.loads((run / "config.json").read_text())
    assert stored["tools"] == str(EXAMPLE / "tools.py") and stored["reward"] == f"{EXAMPLE / 'rewards.py'}:reward"
    sample = json.loads((run / "samples.json").read_text())[0]
    # the prompt declares the functions' schemas
    assert "get_weather(city: string)" in sample["prompt"] and "convert_temperature(celsius: number" in sample["prompt"]
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 1 and any(k.startswith("eval/") for k in metrics[-1])
    assert 0.0 <= metrics[-1]["reward/tool"] <= 1.0  # the example reward's execution tier: a share of the gold calls


def test_slca_eval_takes_your_own_tools_as_slca_train_does(tmp_path):
    """``slca eval --suite toucan --data rows --tools tools.py``: the rows take their schemas from the functions and
    the functions answer the calls (an in-process check of the loaded suite), the report runs end to end on the
    embedded model; --tools with another suite is refused in one line before a model loads."""
    from slca.eval.runner import EvalConfig, _in_domain, run_eval
    from slca.eval.agent import GenerationConfig
    from slca.env.python_tools import PythonSimulator

    cfg = EvalConfig(model="default", suite="toucan", data=str(EXAMPLE / "tasks.jsonl"), tools=str(EXAMPLE / "tools.py"),
                     limit=2, gen=GenerationConfig(max_new_tokens=24), progress=False)
    suite = _in_domain(cfg)
    tasks, make_env = suite.keywords["tasks"], suite.keywords["make_env"]
    env = make_env(tasks[0])
    assert isinstance(env, PythonSimulator) and len(tasks) == 2
    assert {t["function"]["name"] for t in tasks[0].tools} <= {"get_weather", "convert_temperature"}
    rep = run_eval(cfg, tmp_path / "out")
    assert rep.config["tasks"] == 2 and (tmp_path / "out" / "toucan.json").exists()
    r = slca("eval", "--model", "default", "--suite", "toolworld", "--tools", str(EXAMPLE / "tools.py"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert [ln for ln in r.stderr.splitlines() if ln.strip()][-1] == \
        "error: --tools: your own tool functions answer the calls of --suite toucan --data rows, not --suite toolworld"
