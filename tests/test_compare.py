"""`slca compare` end to end on a tiny budget, and its statistics."""

import json
import math
import subprocess
import sys

import pytest

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
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
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
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "seed" not in r.stdout.split("report:")[0], r.stdout + r.stderr  # no run reported as trained
    assert {p: p.read_bytes() for p in out.glob("*/metrics.jsonl")} == metrics
    # a study's committed records hold no checkpoints: finished records still count as done
    import shutil

    for ck in out.glob("*/checkpoints"):
        shutil.rmtree(ck)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "seed" not in r.stdout.split("report:")[0], r.stdout + r.stderr
    assert {p: p.read_bytes() for p in out.glob("*/metrics.jsonl")} == metrics
    # another lr: the stored runs do not match and the comparison is refused, naming the difference
    r = subprocess.run(cmd + ["--set", "lr=0.001"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "were trained with another config: grpo-seed0 (lr: 0.0002 -> 0.001)" in r.stderr, r.stdout + r.stderr
    assert {p: p.read_bytes() for p in out.glob("*/metrics.jsonl")} == metrics


def test_compare_refuses_bad_input(tmp_path):
    r = subprocess.run([sys.executable, "-m", "slca.cli", "compare", "--estimators", "grpo,nope", "--seeds", "0", "--out", str(tmp_path),
                        "--set", "model=/nonexistent"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown estimator 'nope'" in r.stderr and r.stderr.count("\n") == 1
    r = subprocess.run([sys.executable, "-m", "slca.cli", "compare", "--seeds", "0", "--set", "steps=zero", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr == "error: steps: must be an integer, got 'zero'\n"
