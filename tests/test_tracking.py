"""report_to: every tracker receives the metrics, read back through the tracker's own API.

Real packages, no mocks: wandb in offline mode (its run file read with ``wandb leet
inspect``), mlflow with a local SQLite store (``MlflowClient.get_metric_history``),
trackio's local SQLite store, TensorBoard's event files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

# trackio reads TRACKIO_DIR once, when it is first imported (collection runs before that)
os.environ.setdefault("TRACKIO_DIR", tempfile.mkdtemp(prefix="slca-trackio-"))

from slca.training.tracking import TRACKERS, Trackers, parse_report_to, scalars  # noqa: E402
from test_trainer import _cfg, _trainer_kwargs, tiny  # noqa: E402, F401  (tiny: the trainer tests' fixture)


def test_parse_report_to():
    assert parse_report_to("none") == [] and parse_report_to([]) == [] and parse_report_to(None) == []
    assert parse_report_to("tensorboard, tensorboard") == ["tensorboard"]
    assert parse_report_to(["TensorBoard"]) == ["tensorboard"]
    assert set(parse_report_to("all")) <= set(TRACKERS) and "tensorboard" in parse_report_to("all")
    with pytest.raises(ValueError, match="unknown tracker 'comet'"):
        parse_report_to("tensorboard,comet")


def test_missing_tracker_package_is_refused_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ValueError, match=r"'wandb' needs the wandb package.*slca\[wandb\]"):
        parse_report_to("wandb")


def test_mlflow_file_store_is_refused(monkeypatch):
    pytest.importorskip("mlflow")
    for uri in ("file:///tmp/mlruns", "./mlruns"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(ValueError, match="file store, which cannot hold metrics"):
            parse_report_to("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    assert parse_report_to("mlflow") == ["mlflow"]


def test_scalars_keeps_finite_numbers_only():
    assert scalars({"step": 3, "a": 1, "b": float("nan"), "c": None, "d": True, "e": "x", "f": 0.5}) == {"a": 1.0, "f": 0.5}


# ------------------------------------------------------------------ readers (each tracker's own API)


def read_tensorboard(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]}


def read_wandb(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(runs[0])], capture_output=True, text=True, check=True).stdout
    series: dict[str, list[tuple[int, float]]] = {}
    for line in out.splitlines():
        rec = json.loads(line)
        if rec.get("type") == "history":
            item = rec["history"]["item"]
            for k, v in item.items():
                if not k.startswith("_"):
                    series.setdefault(k, []).append((int(item["_step"]), float(v)))
    return series


def read_mlflow(name: str, project: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    c = MlflowClient()
    exp = c.get_experiment_by_name(project)
    (run,) = c.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{name}'")
    return {k: sorted((m.step, m.value) for m in c.get_metric_history(run.info.run_id, k)) for k in run.data.metrics}


def read_trackio(name: str, project: str) -> dict[str, list[tuple[int, float]]]:
    from trackio.sqlite_storage import SQLiteStorage

    series: dict[str, list[tuple[int, float]]] = {}
    for row in SQLiteStorage.get_logs(project, name):
        for k, v in row.items():
            if k not in ("step", "timestamp"):
                series.setdefault(k, []).append((int(row["step"]), float(v)))
    return series


def expected_series(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for k, v in scalars(r).items():
            out.setdefault(k, []).append((r["step"], v))
    return out


def assert_same_series(got: dict, want: dict, who: str) -> None:
    assert set(got) == set(want), (who, sorted(set(got) ^ set(want)))
    for k in want:
        assert [s for s, _ in got[k]] == [s for s, _ in want[k]], (who, k)
        assert [v for _, v in got[k]] == pytest.approx([v for _, v in want[k]], rel=1e-6), (who, k)


@pytest.fixture
def tracker_env(tmp_path, monkeypatch):
    for name in ("wandb", "mlflow", "trackio"):
        pytest.importorskip(name)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")  # a local store in one file
    return f"slca-test-{uuid.uuid4().hex[:8]}"


@pytest.mark.slow
def test_every_tracker_gets_every_record(tmp_path, tracker_env):
    project, run_dir = tracker_env, tmp_path / "my-run"
    records = [{"step": 0, "eval/success": 0.25}, {"step": 1, "loss": 0.5, "reward/tool": 0.1, "bad": float("nan")},
               {"step": 2, "loss": 0.25, "reward/tool": 0.3, "eval/success": 0.5, "kind/lookup/success": 1.0}]
    tr = Trackers(["tensorboard", "wandb", "mlflow", "trackio"], run_dir, {"lr": 0.1, "report_to": ["wandb"]}, project=project)
    for r in records:
        tr.log(r)
    tr.close()
    want = expected_series(records)
    assert_same_series(read_tensorboard(run_dir), want, "tensorboard")
    assert_same_series(read_wandb(run_dir), want, "wandb")
    assert_same_series(read_mlflow("my-run", project), want, "mlflow")
    assert_same_series(read_trackio("my-run", project), want, "trackio")


def test_no_tracker_writes_nothing(tmp_path):
    tr = Trackers([], tmp_path, {})
    tr.log({"step": 1, "loss": 1.0})
    tr.close()
    assert list(tmp_path.iterdir()) == []



@pytest.mark.slow
def test_training_run_reports_to_every_tracker_from_step_0(tmp_path, tracker_env, tiny):
    from slca.training.trainer import train

    project = tracker_env
    cfg = _cfg(tmp_path, steps=2, eval_every=1, save_every=0, eval_on_start=True, project=project,
               report_to=["tensorboard", "wandb", "mlflow", "trackio"])
    train(cfg, **_trainer_kwargs(tiny))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # step 0 is the baseline evaluation, before any update; then the 1-based updates
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["eval/success"] is not None and all(k == "step" or k.startswith(("eval/", "probe/", "perf/")) for k in rows[0])
    want = expected_series(rows)
    run_dir = tmp_path / "run"
    assert_same_series(read_tensorboard(run_dir), want, "tensorboard")
    assert_same_series(read_wandb(run_dir), want, "wandb")
    assert_same_series(read_mlflow("run", project), want, "mlflow")
    assert_same_series(read_trackio("run", project), want, "trackio")
