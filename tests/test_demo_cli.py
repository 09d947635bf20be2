"""`slca demo` end to end on a tiny budget: both arms train as their own processes, side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from slca import cli
from slca.cli import app
from slca.training.config import TrainConfig, validate

TINY = ["--quick", "--set", "steps=2", "--set", "tasks_per_step=2", "--set", "eval_every=2", "--set", "eval_tasks=4",
        "--set", "ood_eval_tasks=4", "--set", "sample_html_every=1"]


def test_demo_trains_both_arms_in_their_own_processes_and_reports(tmp_path):
    out = tmp_path / "demo"
    r = CliRunner().invoke(app, ["demo", "--out", str(out), *TINY])
    assert r.exit_code == 0, r.output
    for est in ("grpo", "slca"):
        rows = [json.loads(line) for line in (out / est / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows if "reward/tool" in row] == [1, 2]
        assert rows[0]["step"] == 0 and "eval/tool_tasks/success" in rows[0]  # the warm start, evaluated before any update
        assert json.loads((out / est / "config.json").read_text())["estimator"] == est
        assert f"{est.upper()} run: token-level advantages" in (out / est / "tokens.html").read_text()
        assert (out / "logs" / f"{est.upper()}.log").is_file()
    report = (out / "report.md").read_text()
    assert "for the warm start left un-updated on the same tasks" in report  # the frozen baseline reached the verdict
    assert (out / "curves.png").stat().st_size > 0


def test_demo_refuses_no_jobs(tmp_path):
    r = CliRunner().invoke(app, ["demo", "--jobs", "0", "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and "--jobs" in r.output
    assert not (tmp_path / "d").exists()


def test_a_run_that_fails_stops_the_demo_with_the_end_of_its_log(tmp_path, capsys):
    cfg = validate(TrainConfig(run_dir=str(tmp_path / "taken"), steps=1, tasks_per_step=1, group_size=2))
    (tmp_path / "taken").write_text("a file where the run folder should go")  # after the check: the run's own process fails
    steps = []
    with pytest.raises(typer.Exit) as e:
        cli._demo_runs({"X": cfg}, tmp_path / "out", 1, lambda on_step: (steps.append(1), on_step(1), [0.5])[-1])
    assert e.value.exit_code == 2 and steps == [1]  # the baseline ran beside the run
    err = capsys.readouterr().err
    log = (tmp_path / "out" / "logs" / "X.log").read_text().strip().splitlines()
    assert "the X run failed" in err and log and " ".join(log[-1].split()) in err
