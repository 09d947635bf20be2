"""Evaluation results: one typed report per suite, saved as JSON and markdown."""

from __future__ import annotations

import json
import math
import pathlib
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from slca._fs import write_atomic, writing

__all__ = ["PartialRecords", "Record", "SuiteReport", "pass_hat_k", "pass_k", "mean", "group_means", "successes_by_id", "truncation"]


def mean(xs: Iterable[float]) -> float:
    """Mean of the finite values; NaN when there are none."""
    vals = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    return sum(vals) / len(vals) if vals else float("nan")


def pass_hat_k(successes: Mapping[str, list[bool]], k: int) -> float:
    r"""pass^k averaged over tasks (Yao et al., tau-bench, arXiv 2406.12045).

    For a task tried :math:`n` times with :math:`c` successes,
    :math:`\text{pass}^k = \binom{c}{k} / \binom{n}{k}`: the chance that k trials
    drawn without replacement all succeed. Same formula as
    ``tau2.metrics.agent_metrics.pass_hat_k``.

    Args:
        successes: task id -> success of each trial.
        k: number of trials that must all succeed (1 <= k <= trials of every task).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not successes:
        return float("nan")
    vals = []
    for tid, s in successes.items():
        if len(s) < k:
            raise ValueError(f"task {tid!r} has {len(s)} trials, fewer than k={k}")
        vals.append(math.comb(sum(bool(x) for x in s), k) / math.comb(len(s), k))
    return sum(vals) / len(vals)


@dataclass
class Record:
    """One scored rollout: which record, which group, which sample, its scores."""

    id: str
    group: str
    sample: int
    scores: dict[str, float]
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class SuiteReport:
    """The result of one ``slca eval`` run.

    ``metrics`` are the headline numbers; ``groups`` the same per category
    (BFCL), task kind (in-domain) or domain (tau2); ``counts`` the records per
    group; ``records`` every scored rollout.
    """

    suite: str
    model: str
    metrics: dict[str, float]
    groups: dict[str, dict[str, float]]
    counts: dict[str, int]
    samples: int
    records: list[Record]
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return json.loads(json.dumps(d, default=str, allow_nan=True))

    def to_markdown(self) -> str:
        """A markdown summary: headline metrics, then one table row per group."""
        fp = self.config.get("model_fingerprint")
        model = f"`{self.model}`" + (f" (`{fp}`)" if fp else "")
        cost = ""
        if "cpu_seconds" in self.config:
            cost = f", {self.config['seconds']:,.0f} s wall, {self.config['cpu_seconds']:,.0f} CPU s"
        lines = [f"# slca eval: {self.suite}", "", f"model: {model}, samples per record: {self.samples}{cost}", ""]
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in self.metrics.items()]
        if self.groups:
            cols = sorted({c for g in self.groups.values() for c in g})
            lines += ["", "| group | n | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
            for g, vals in self.groups.items():
                lines.append(f"| {g} | {self.counts.get(g, '')} | " + " | ".join(_fmt(vals.get(c)) for c in cols) + " |")
        if self.notes:
            lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def save(self, out_dir: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
        """Write ``<suite>.json`` and ``<suite>.md`` into ``out_dir``; return both paths."""
        out = pathlib.Path(out_dir)
        jp, mp = out / f"{self.suite}.json", out / f"{self.suite}.md"
        with writing(jp, "the evaluation report"):  # a failed write: one line naming the file (WriteError)
            out.mkdir(parents=True, exist_ok=True)
            jp.write_text(json.dumps(self.to_dict(), indent=2))
            mp.write_text(self.to_markdown())
        return jp, mp


class PartialRecords:
    """The records of an evaluation's finished parts (BFCL categories), kept in ``folder`` until its report is written,
    so that an evaluation stopped part way (killed, out of memory, a machine that goes away) starts again at its first
    unfinished part. A part is reused only if it was saved under the same ``key`` (the model's fingerprint and every
    setting that changes its records); a part saved under another key, or a file cut short, runs again and is
    overwritten. The writer of the report calls :meth:`clear`. ``resumed`` names the parts read back."""

    def __init__(self, folder: str | pathlib.Path, key: Mapping[str, Any]):
        self.folder = pathlib.Path(folder)
        self.key = json.loads(json.dumps(dict(key), default=str))  # as it reads back from disk
        self.resumed: list[str] = []
        self._ours: set[str] = set()  # the parts this object read or wrote: the only files clear() removes

    def _path(self, part: str) -> pathlib.Path:
        return self.folder / f"{part}.json"

    def load(self, part: str) -> tuple[list[Record], int] | None:
        """``(records, generated tokens)`` of ``part`` saved under this key, else None."""
        try:
            d = json.loads(self._path(part).read_text())
            if not isinstance(d, dict) or d.get("key") != self.key:
                return None
            out = [Record(**r) for r in d["records"]], int(d["generated_tokens"])
        except (OSError, ValueError, TypeError, KeyError):  # none, unreadable, cut short or not ours: the part runs again
            return None
        self.resumed.append(part)
        self._ours.add(part)
        return out

    def save(self, part: str, records: list[Record], generated_tokens: int) -> None:
        """Write ``part``'s records (whole or not at all: written aside, then renamed into place)."""
        path = self._path(part)
        with writing(path, "the records of a finished part of the evaluation"):
            self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"key": self.key, "generated_tokens": int(generated_tokens),
                                       "records": [asdict(r) for r in records]}, default=str, allow_nan=True))
        self._ours.add(part)

    def clear(self) -> None:
        """Remove the parts this object read or wrote, and the folder if that leaves it empty (nothing else in it is
        touched)."""
        for part in self._ours:
            self._path(part).unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:  # gone already, or holds something that is not ours
            pass


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def group_means(records: list[Record], keys: Iterable[str]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Mean of each score key per record group, and the number of distinct records per group."""
    by: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by[r.group].append(r)
    keys = list(keys)
    groups = {g: {k: mean(r.scores.get(k, float("nan")) for r in rs) for k in keys} for g, rs in sorted(by.items())}
    counts = {g: len({r.id for r in rs}) for g, rs in sorted(by.items())}
    return groups, counts


def successes_by_id(records: list[Record], key: str) -> dict[str, list[bool]]:
    """Record id -> success of each sample (score ``key`` at 1 within 1e-6, as tau2's ``is_successful``)."""
    out: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        v = r.scores.get(key, float("nan"))
        out[r.id].append(not math.isnan(v) and abs(v - 1.0) <= 1e-6)
    return dict(out)


def pass_k(records: list[Record], key: str, ks: Iterable[int]) -> dict[str, float]:
    """``{"pass^k": ...}`` for each k in ``ks``: :func:`pass_hat_k` over the records' ids, a
    sample succeeding when its score ``key`` is 1 (:func:`successes_by_id`)."""
    succ = successes_by_id(records, key)
    return {f"pass^{k}": pass_hat_k(succ, k) for k in ks}


def truncation(records: list[Record], limit: str, consequence: str = "") -> tuple[int, list[str]]:
    """The rollouts with a prompt cut to the model's positions (``detail["truncated_turns"]`` > 0),
    and the report note saying so (none when no rollout was cut). ``limit``: the model's prompt
    limit in words (:meth:`slca.eval.agent.PolicyAgent.prompt_limit`)."""
    n = sum(1 for r in records if r.detail["truncated_turns"])
    if not n:
        return 0, []
    return n, [f"{n} of {len(records)} rollouts had prompts over the model's {limit} and were cut to their last tokens{consequence}"]
