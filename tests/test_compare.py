"""`slca compare` end to end on a tiny budget, and its statistics; a signal stops it and every run it started, and
the command it prints continues them; it writes only into a folder of its own."""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _slca_procs import ENV, HAS_PROC, SLCA, Started, alive, in_process, sets, sigint_default, wait_until

from slca.reporting.compare import t_interval


def test_t_interval_hand_values():
    mu, hw = t_interval([1.0, 2.0, 3.0])
    assert mu == pytest.approx(2.0)
    assert hw == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-4)
    assert math.isnan(t_interval([1.0])[1])
    assert t_interval([float("nan"), 2.0, 4.0])[0] == pytest.approx(3.0)


def test_t_interval_past_30_degrees_of_freedom():
    xs = [float(i % 7) for i in range(41)]  # 40 degrees of freedom: t = 2.0211 (a table capped at 30 said 2.042)
    mu, hw = t_interval(xs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / 40)
    assert hw == pytest.approx(2.021075 * sd / math.sqrt(41), rel=1e-5)


def test_bands_are_clipped_to_the_metric_range():
    from slca.reporting.compare import band

    mu, hw = t_interval([0.0, 1.0])  # 2 seeds: half-width 6.35
    assert band("eval/success", [mu], [hw]) == ([0.0], [1.0])
    assert band("grad/cosine_tool_summary", [0.9], [0.5]) == ([0.4], [1.0])
    assert band("probe/parallel_pref", [0.0], [2.0]) == ([-2.0], [2.0])


@pytest.mark.slow
def test_compare_cli_tiny_budget(tmp_path, tiny_model_dir):
    out = tmp_path / "cmp"
    sets = [f"model={tiny_model_dir}", "steps=2", "tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=10",
            "eval_every=2", "eval_tasks=2", "save_every=0", "summary_noise=0.5", "minibatches=1"]
    cmd = [sys.executable, "-m", "slca.cli", "compare", "--estimators", "grpo,slca", "--seeds", "0,1", "--out", str(out), "--jobs", "2"]
    for s in sets:
        cmd += ["--set", s]
    r = in_process(*cmd[3:])  # the command in this process (its own process adds only imports); each run is a process of its own
    assert r.returncode == 0, r.stdout + r.stderr
    md = (out / "report.md").read_text()
    assert "| grpo |" in md and "| slca |" in md and "slca - grpo" in md
    summary = json.loads((out / "summary.json").read_text())
    assert sorted((x["estimator"], x["seed"]) for x in summary["runs"]) == [("grpo", 0), ("grpo", 1), ("slca", 0), ("slca", 1)]
    assert (out / "curves_compare.png").stat().st_size > 10_000
    # contamination is measured per step: exactly 0 under SLCA on a step where every rollout
    # answered (a rollout without an answer gives its summary verdict to its last tool turn:
    # empty_summary="last_turn", docs/beyond.md)
    for x in summary["runs"]:
        assert x["estimator"] == "grpo" or math.isnan(x["adv/contamination"]) or 0.0 <= x["adv/contamination"] <= 1.0
    for run in out.glob("slca-seed*"):
        for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
            if row.get("adv/contamination") is not None and row["rollout/no_summary_segment"] == 0:
                assert row["adv/contamination"] == 0.0, (run.name, row["step"])
    # the same comparison again reuses the finished runs: nothing is retrained
    metrics = {p: p.read_bytes() for p in out.glob("*/metrics.jsonl")}
    r = in_process(*cmd[3:])
    assert r.returncode == 0 and "seed" not in r.stdout.split("report:")[0], r.stdout + r.stderr  # no run reported as trained
    assert {p: p.read_bytes() for p in out.glob("*/metrics.jsonl")} == metrics
    # a study's committed records hold no checkpoints: finished records still count as done
    import shutil

    for ck in out.glob("*/checkpoints"):
        shutil.rmtree(ck)
    r = in_process(*cmd[3:])
    assert r.returncode == 0 and "seed" not in r.stdout.split("report:")[0], r.stdout + r.stderr
    assert {p: p.read_bytes() for p in out.glob("*/metrics.jsonl")} == metrics
    # another lr: the stored runs do not match and the comparison is refused, naming the difference
    r = in_process(*cmd[3:], "--set", "lr=0.001")
    assert r.returncode == 2 and "were trained with another config: grpo-seed0 (lr: 0.0002 -> 0.001)" in r.stderr, r.stdout + r.stderr
    assert {p: p.read_bytes() for p in out.glob("*/metrics.jsonl")} == metrics


def test_compare_refuses_bad_input(tmp_path):
    r = in_process("compare", "--estimators", "grpo,nope", "--seeds", "0", "--out", str(tmp_path), "--set", "model=/nonexistent")
    assert r.returncode == 2 and "unknown estimator 'nope'" in r.stderr and r.stderr.count("\n") == 1
    r = in_process("compare", "--seeds", "0", "--set", "steps=zero", "--out", str(tmp_path))
    assert r.returncode == 2 and r.stderr == "error: steps: must be an integer, got 'zero'\n"


def test_compare_refuses_an_out_folder_that_is_not_a_comparisons(tmp_path):
    from typer.testing import CliRunner

    from slca.cli import app

    out = tmp_path / "project"
    (out / "src").mkdir(parents=True)
    (out / "report.md").write_text("my own report")
    r = CliRunner().invoke(app, ["compare", "--estimators", "grpo", "--seeds", "0", "--out", str(out)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: --out: '{out}' holds files that are not a comparison's (report.md, src)")
    assert (out / "report.md").read_text() == "my own report" and sorted(p.name for p in out.iterdir()) == ["report.md", "src"]


# ------------------------------------------------------------------ the comparison's processes: signals, a parent killed outright

CMP_SETS = ["tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=8", "eval_every=0", "eval_tasks=2", "minibatches=1",
            "report_to=none", "ood_splits=none", "save_every=1", "keep_checkpoints=1", "sample_html_every=1"]


def _compare_args(out, model, steps: int) -> list[str]:
    return ["compare", "--estimators", "grpo,slca", "--seeds", "0", "--jobs", "2", "--out", str(out),
            *sets(f"model={model}", f"steps={steps}", *CMP_SETS)]


def _both_saved(out, run: Started) -> list[int]:
    """Wait until both runs have a checkpoint; their processes."""
    kids = run.wait_for_kids(2, timeout=180)
    for name in ("grpo-seed0", "slca-seed0"):
        wait_until(lambda: any((out / name / "checkpoints").glob("step-*")), 180, f"{name}'s first checkpoint", run.p)
    return kids


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="reads child processes from /proc (Linux)")
def test_ctrl_c_stops_every_run_and_the_command_it_prints_continues_them(tmp_path, tiny_model_dir):
    import shlex

    out = tmp_path / "cmp"
    with Started([*SLCA, *_compare_args(out, tiny_model_dir, 20)], tmp_path / "proc", preexec_fn=sigint_default) as run:
        kids = _both_saved(out, run)
        run.p.send_signal(signal.SIGINT)
        assert run.wait(timeout=60) == 130, run.stderr[-3000:]
        assert wait_until(lambda: not [k for k in kids if alive(k)], 30, "both runs stopped") < 15
        err = [x for x in run.stderr.splitlines() if x.strip()]
        assert err[-2].startswith("interrupted (Ctrl-C): the runs still training were stopped; each keeps its newest checkpoint"), err
        assert err[-1].startswith("continue: slca compare --estimators grpo,slca"), err
    # the printed command, as a user pastes it: the stopped runs resume from their checkpoints and the comparison ends
    cmd = shlex.split(err[-1].removeprefix("continue: ").split("   (")[0])
    r = subprocess.run([*SLCA, *cmd[1:]], capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for name in ("grpo-seed0", "slca-seed0"):
        assert "resumed from step" in (out / "logs" / f"{name}.log").read_text()
        assert [json.loads(x)["step"] for x in (out / name / "metrics.jsonl").read_text().splitlines()] == list(range(1, 21))
    assert (out / "report.md").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="reads child processes from /proc (Linux)")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGKILL"])
def test_kill_pid_closing_the_terminal_or_killing_compare_outright_stops_every_run(tmp_path, tiny_model_dir, how):
    """SIGTERM (``kill PID``) and SIGHUP (the terminal closed): compare stops its runs itself and says how to continue.
    SIGKILL (nothing to catch): the runs see their parent gone and stop themselves, each saying how to resume in its log."""
    out = tmp_path / "cmp"
    with Started([*SLCA, *_compare_args(out, tiny_model_dir, 500)], tmp_path / "proc") as run:
        kids = _both_saved(out, run)
        run.p.send_signal(getattr(signal, how))
        assert run.wait(timeout=60) == {"SIGTERM": 143, "SIGHUP": 129, "SIGKILL": -signal.SIGKILL}[how], run.stderr[-3000:]
        assert wait_until(lambda: not [k for k in kids if alive(k)], 30, "both runs stopped") < 15
        if how != "SIGKILL":
            err = [x for x in run.stderr.splitlines() if x.strip()]
            assert err[-2].startswith(f"interrupted ({how}): the runs still training were stopped"), err
            assert err[-1].startswith("continue: slca compare --estimators grpo,slca"), err
    for name in ("grpo-seed0", "slca-seed0"):
        log = (out / "logs" / f"{name}.log").read_text()
        assert "interrupted (SIGTERM): " in log and f"resume: slca train --resume {out / name}" in log, log[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="reads child processes from /proc (Linux)")
def test_a_run_killed_for_memory_fails_alone_and_the_same_command_resumes_it(tmp_path, tiny_model_dir):
    """The kernel's out-of-memory killer takes one run (SIGKILL): the other trains to the end (each seed is independent),
    the command then names the failed run and its log (exit 2), and the same command again reuses the finished run and
    resumes the killed one from its checkpoint."""
    out = tmp_path / "cmp"
    args = _compare_args(out, tiny_model_dir, 10)
    with Started([*SLCA, *args], tmp_path / "proc") as run:
        kids = _both_saved(out, run)
        (victim,) = [k for k in kids if f"run_dir={out / 'slca-seed0'}".encode() in Path(f"/proc/{k}/cmdline").read_bytes()]
        os.kill(victim, signal.SIGKILL)
        assert run.wait(timeout=600) == 2, run.stderr[-3000:]
        assert "slca seed 0: failed (killed by SIGKILL)" in " ".join(run.stdout.split()), run.stdout[-3000:]
        (line,) = [x for x in run.stderr.splitlines() if x.strip()]
        assert line == f"error: runs failed: slca seed 0 (see {out / 'logs' / 'slca-seed0.log'})", line
    def steps(name: str) -> list[int]:
        return [json.loads(x)["step"] for x in (out / name / "metrics.jsonl").read_text().splitlines() if x.strip()]

    assert steps("grpo-seed0") == list(range(1, 11))  # the other run went on to the end
    finished = (out / "grpo-seed0" / "metrics.jsonl").read_bytes()
    r = subprocess.run([*SLCA, *args], capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resumed from step" in (out / "logs" / "slca-seed0.log").read_text()
    assert steps("slca-seed0") == list(range(1, 11))
    assert (out / "grpo-seed0" / "metrics.jsonl").read_bytes() == finished  # reused, not retrained
    assert (out / "report.md").is_file()
