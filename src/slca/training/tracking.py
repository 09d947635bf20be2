"""Experiment trackers: where a run's metrics go besides ``metrics.jsonl`` (TRL's ``report_to``).

``metrics.jsonl`` is always written (reports, ``slca compare`` and resume read it);
``report_to`` adds any of:

=============== ======================================================================
``tensorboard``  event files under ``<run_dir>/tb`` (``tensorboard --logdir <run_dir>``)
``wandb``        a Weights & Biases run (project ``cfg.project``; ``WANDB_MODE=offline``
                 writes it under ``<run_dir>/wandb`` for ``wandb sync`` later)
``mlflow``       an MLflow run in experiment ``cfg.project`` of the tracking store that
                 ``MLFLOW_TRACKING_URI`` names (mlflow's default: ``sqlite:///mlflow.db``
                 in the working folder; mlflow's file store is refused, see below);
                 the config is logged as params
``trackio``      a trackio run in project ``cfg.project`` (local SQLite under
                 ``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``)
=============== ======================================================================

Every tracker gets the same scalars at the same step: the 1-based index of the
optimizer step just taken (0 for the evaluation before training, ``eval_on_start``).
Each is an optional extra (``pip install "slca[wandb]"``); naming one that is not
installed is refused by :func:`parse_report_to` before any work starts, and so is
an mlflow file store (``file:./mlruns``): it keeps metric ``a/b`` as a file and so
cannot also hold ``a/b/c``, as ``reward/summary`` and ``reward/summary/faithfulness``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from slca._fs import writing

__all__ = ["TRACKERS", "parse_report_to", "scalars", "Tracker", "Trackers", "make_trackers"]

TRACKERS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
"""report_to name -> the module it needs (also the name of its pip extra)."""


def parse_report_to(value: str | list[str] | tuple[str, ...] | None, *, check_installed: bool = True) -> list[str]:
    """Normalise ``report_to``: ``"none"`` / ``[]`` -> ``[]``; ``"all"`` -> every installed
    tracker; ``"wandb,mlflow"`` or ``["wandb", "mlflow"]`` -> that list (order kept, no repeats).

    Raises:
        ValueError: an unknown name, or (``check_installed``) a tracker whose package is missing.
    """
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(x).strip().lower() for x in items if str(x).strip()]
    if names == ["none"] or not names:
        return []
    if names == ["all"]:
        return [n for n, mod in TRACKERS.items() if importlib.util.find_spec(mod) is not None]
    out: list[str] = []
    for n in names:
        if n not in TRACKERS:
            raise ValueError(f"report_to: unknown tracker {n!r}; choose from {sorted(TRACKERS)}, 'all' or 'none'")
        if check_installed and importlib.util.find_spec(TRACKERS[n]) is None:
            raise ValueError(f"report_to: {n!r} needs the {TRACKERS[n]} package, which is not installed (pip install \"slca[{n}]\")")
        if n == "mlflow":
            _check_mlflow_store(os.environ.get("MLFLOW_TRACKING_URI", ""))
        if n not in out:
            out.append(n)
    return out


def _check_mlflow_store(uri: str) -> None:
    # mlflow's file store keeps metric "a/b" as a file, so it cannot also hold "a/b/c"
    # (slca logs reward/summary and reward/summary/faithfulness)
    if uri and (uri.startswith("file:") or "://" not in uri):
        raise ValueError(f"report_to: MLFLOW_TRACKING_URI={uri!r} is mlflow's file store, which cannot hold metrics "
                         "named 'reward/summary' and 'reward/summary/faithfulness' together; use a database store "
                         "(sqlite:///mlflow.db, mlflow's default) or a tracking server")


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numeric values of one metrics record, ``step`` left out (trackers take it apart)."""
    return {
        k: float(v) for k, v in metrics.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class Tracker(Protocol):
    def log(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class _TensorBoard:
    def __init__(self, run_dir: Path, config: dict[str, Any], name: str, project: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(str(run_dir / "tb"))

    def log(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.w.add_scalar(k, v, step)
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class _Wandb:
    def __init__(self, run_dir: Path, config: dict[str, Any], name: str, project: str) -> None:
        import wandb

        # wandb reads WANDB_MODE, WANDB_RUN_ID, WANDB_RESUME, WANDB_ENTITY itself
        self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=config, reinit="create_new")

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class _Mlflow:
    def __init__(self, run_dir: Path, config: dict[str, Any], name: str, project: str) -> None:
        # the client API, not mlflow's fluent global "active run": two trainers in one
        # process (slca demo) each own their run
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()  # MLFLOW_TRACKING_URI, or mlflow's default store
        exp = self.client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in sorted(config.items())]  # mlflow caps param values
        for i in range(0, len(params), 100):  # and params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, v, ts, step) for k, v in values.items()]
        for i in range(0, len(ms), 1000):  # mlflow's batch limit
            self.client.log_batch(self.run_id, metrics=ms[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class _Trackio:
    def __init__(self, run_dir: Path, config: dict[str, Any], name: str, project: str) -> None:
        import trackio

        # no dashboard, no system-metric threads: a training run only writes its metrics
        self.run = trackio.init(project=project, name=name, config=config, embed=False, auto_log_cpu=False, auto_log_gpu=False)

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


_BACKENDS = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow, "trackio": _Trackio}
_FOLDERS = {"tensorboard": "tb"}
"""Trackers that write into the run folder, and where: a failed write there is named (:class:`slca._fs.WriteError`)."""


class Trackers:
    """Fan-out to the chosen trackers; opened on the first record so a refused config opens none."""

    def __init__(self, names: list[str], run_dir: str | Path, config: dict[str, Any], *, name: str | None = None, project: str = "slca") -> None:
        self.names = parse_report_to(names)
        self.run_dir = Path(run_dir)
        self.config = config
        self.name = name or self.run_dir.resolve().name
        self.project = project
        self._open: list[Tracker] | None = None

    def log(self, metrics: dict[str, Any]) -> None:
        """Send one metrics record (with its ``step``) to every tracker."""
        if not self.names:
            return
        if self._open is None:
            self._open = [_BACKENDS[n](self.run_dir, self.config, self.name, self.project) for n in self.names]
        values = scalars(metrics)
        for name, t in zip(self.names, self._open):
            folder = _FOLDERS.get(name)
            with writing(self.run_dir / folder, f"the {name} record of step {metrics['step']}") if folder else contextlib.nullcontext():
                t.log(values, int(metrics["step"]))

    def close(self) -> None:
        for t in self._open or []:
            t.close()
        self._open = None


def make_trackers(cfg: Any) -> Trackers:
    """:class:`Trackers` for a :class:`~slca.training.config.TrainConfig` (its ``report_to``, ``project``, ``run_dir``; the whole
    config is logged as ``dataclasses.asdict`` gives it, as ``slca.training.config.to_dict`` does)."""
    return Trackers(cfg.report_to, cfg.run_dir, dataclasses.asdict(cfg), project=cfg.project)
