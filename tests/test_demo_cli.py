"""`slca demo` end to end on a tiny budget: both arms train as their own processes, side by side; a signal or a run
that dies stops it and every process it started; it writes only into a folder of its own."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from _slca_procs import HAS_PROC, SLCA, Started, alive, sets, sigint_default, wait_until
from slca import cli
from slca.cli import app
from slca.training.config import TrainConfig, validate

TINY = ["--quick", "--set", "steps=2", "--set", "tasks_per_step=2", "--set", "group_size=2", "--set", "eval_every=2", "--set",
        "eval_tasks=2", "--set", "ood_eval_tasks=2", "--set", "sample_html_every=1"]


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
        assert (out / "logs" / f"{est}.log").is_file() and (out / "logs" / f"{est}.config.json").is_file()
    for folder, est in (("grpo_noisy", "grpo"), ("slca_noisy", "slca")):  # the noisy-judge pair, each its own process too
        stored = json.loads((out / folder / "config.json").read_text())
        assert (stored["estimator"], stored["summary_noise"]) == (est, cli.DEMO_NOISE)
        assert stored["ood_splits"] == ["fresh"]
    rows = [json.loads(line) for line in (out / "slca" / "metrics.jsonl").read_text().splitlines()]
    assert any(k.startswith("eval_fresh/") for k in rows[0])  # out of distribution: the split nobody chose on
    report = (out / "report.md").read_text()
    assert "for the warm start left un-updated on the same tasks" in report  # the frozen baseline reached the verdict
    assert "With a noisy summary judge" in report and "What 10 seeds show" in report and "area under its curve" in report
    assert (out / "curves.png").stat().st_size > 0


def test_demo_refuses_no_jobs(tmp_path):
    r = CliRunner().invoke(app, ["demo", "--jobs", "0", "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and "--jobs" in r.output
    assert not (tmp_path / "d").exists()


def test_a_run_that_fails_stops_the_demo_with_the_end_of_its_log(tmp_path, capsys):
    cfg = validate(TrainConfig(run_dir=str(tmp_path / "taken"), steps=1, tasks_per_step=1, group_size=2))
    (tmp_path / "taken").write_text("a file where the run folder should go")  # after the check: the run's own process fails
    steps = []

    def baseline(on_step):  # replays step after step until the failed run stops it
        for k in range(1, 10_000):
            time.sleep(0.05)
            steps.append(k)
            on_step(k)

    t0 = time.monotonic()
    with pytest.raises(typer.Exit) as e:
        cli._demo_runs({"X": cfg}, tmp_path / "out", 1, baseline)
    assert e.value.exit_code == 2 and time.monotonic() - t0 < 120
    assert steps and len(steps) < 9_999  # the baseline ran beside the run, and was stopped by its failure
    n = len(steps)
    time.sleep(0.5)
    assert len(steps) == n  # and stays stopped
    err = capsys.readouterr().err
    log = (tmp_path / "out" / "logs" / "taken.log").read_text()  # named after its run folder.strip().splitlines()
    assert "the X run failed (exit 2); the other runs were stopped" in err and log and " ".join(log[-1].split()) in err


def test_demo_refuses_an_out_folder_that_is_not_a_demos(tmp_path):
    out = tmp_path / "models"
    (out / "other-model").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    r = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: --out: '{out}' holds files that are not a demo's (notes.txt, other-model)")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "other-model"]


# ------------------------------------------------------------------ the demo's processes: signals and a run that dies


def _demo(tmp_path, model) -> Started:
    args = ["demo", "--quick", "--out", str(tmp_path / "demo"), "--model", str(model), "--jobs", "2"]  # GRPO and SLCA first
    args += sets("steps=500", "tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=8", "eval_every=0", "eval_tasks=2",
                 "ood_eval_tasks=2", "minibatches=1", "report_to=none", "ood_splits=none", "sample_html_every=0")
    return Started([*SLCA, *args], tmp_path / "proc", preexec_fn=sigint_default)


def _training(tmp_path, run: Started) -> dict[str, int]:
    """Wait until both arms train (each has logged a step); their processes by arm. Two runs at a time (``--jobs 2``):
    the noisy-judge pair waits its turn, and a stopped demo never starts it."""
    kids = run.wait_for_kids(2, timeout=180)
    for arm in ("grpo", "slca"):
        wait_until(lambda: (tmp_path / "demo" / arm / "metrics.jsonl").is_file(), 180, f"the {arm} run's first step", run.p)
    arms = {}
    for k in kids:
        args = Path(f"/proc/{k}/cmdline").read_bytes().decode(errors="replace").split("\0")
        arms.update({Path(a).name.removesuffix(".config.json"): k for a in args if a.endswith(".config.json")})
    assert sorted(arms) == ["grpo", "slca"], arms  # logs/<run folder>.config.json
    return {"GRPO": arms["grpo"], "SLCA": arms["slca"]}


def _queued_never_started(tmp_path) -> None:
    """The arms still waiting for a slot when the demo stopped were never started."""
    for folder in ("grpo_noisy", "slca_noisy"):
        assert not (tmp_path / "demo" / "logs" / f"{folder}.log").exists() and not (tmp_path / "demo" / folder).exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="reads child processes from /proc (Linux)")
def test_sigterm_stops_the_demo_and_both_runs_and_says_how_to_continue(tmp_path, tiny_model_dir):
    with _demo(tmp_path, tiny_model_dir) as run:
        arms = _training(tmp_path, run)
        run.p.terminate()  # kill PID
        assert run.wait(timeout=60) == 143, run.stderr[-3000:]
        took = wait_until(lambda: not [k for k in arms.values() if alive(k)], 30, "both runs stopped")
        assert took < 15
        err = [x for x in run.stderr.splitlines() if x.strip()]
        assert err[-2].startswith("interrupted (SIGTERM): the demo's runs were stopped"), err
        assert err[-1].startswith("continue: slca demo --quick --out ") and "--set steps=500" in err[-1], err
        for arm in arms:  # each run stopped cleanly, as slca train on SIGTERM
            assert "interrupted (SIGTERM): " in (tmp_path / "demo" / "logs" / f"{arm.lower()}.log").read_text()
        _queued_never_started(tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="reads child processes from /proc (Linux)")
def test_a_run_killed_for_memory_stops_the_demo_at_once(tmp_path, tiny_model_dir):
    """The kernel's out-of-memory killer sends SIGKILL to one arm: the demo stops the other and says which arm died."""
    with _demo(tmp_path, tiny_model_dir) as run:
        arms = _training(tmp_path, run)
        os.kill(arms["SLCA"], signal.SIGKILL)
        t0 = time.monotonic()
        assert run.wait(timeout=60) == 2, run.stderr[-3000:]
        assert time.monotonic() - t0 < 30
        assert not alive(arms["GRPO"])
        (line,) = [x for x in run.stderr.splitlines() if x.strip()]
        assert line.startswith("error: the SLCA run failed (killed by SIGKILL); the other runs were stopped; "), line
        assert "interrupted (SIGTERM)" in (tmp_path / "demo" / "logs" / "grpo.log").read_text()
        _queued_never_started(tmp_path)
