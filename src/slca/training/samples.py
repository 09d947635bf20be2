"""Recorded sample groups: the tokens of one group of rollouts with the advantage
each reference estimator gives them.

The trainer records a :class:`SampleGroup` every ``sample_html_every`` steps
(:meth:`slca.training.trainer.Trainer.train_step`); they are kept in checkpoints, written
to the run folder's ``samples.json`` and read back by the token page
(:func:`slca.reporting.report.write_token_html`) and ``slca compare``'s diagnostic case
(:func:`slca.reporting.compare.diagnostic_cases`). The JSON layout (``to_json``) is the
one ``samples.json`` has always had::

    [{"step", "task", "kind", "prompt",
      "rollouts": [{"tokens", "model_mask", "tool_mask", "summary_mask",
                    "adv": {estimator: [...]}, "tool_reward", "summary_reward",
                    "stop_reason"}, ...]}, ...]

Reading (``from_json``) checks what the readers compute on and names the group,
rollout and field of anything else: a list of groups, each with a ``rollouts``
list; each rollout with ``tokens``, ``model_mask`` and ``tool_mask`` lists of one
length and ``adv`` a mapping of estimator -> list of finite numbers. Display
fields (``step``, ``task``, ``kind``, ``prompt``, ``stop_reason``, the rewards,
the token texts) are kept as read, whatever JSON value they hold: the page
escapes every one of them. A field missing from a hand-written file gets the
value the page shows for none (``""``; rewards None); a missing
``summary_mask`` is the policy tokens outside the tool segment (the two
segments always add up to ``model_mask``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["SampleRollout", "SampleGroup", "samples_from_json", "samples_to_json", "read_samples", "is_finite_number"]


def is_finite_number(x: Any) -> bool:
    """A finite int or float (not a bool): what an advantage in the layout must be, what the page formats as a number."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class SampleRollout:
    """One recorded rollout: per response token its text, masks and advantages.

    Attributes:
        tokens: decoded text of each response token.
        model_mask: 1 on policy tokens, 0 on environment tokens.
        tool_mask, summary_mask: 0/1, the execution and summary segments.
        adv: estimator -> the advantage of each token (rounded to 4 decimals).
        tool_reward, summary_reward: the rollout's rewards (NaN = unscored).
        stop_reason: why the rollout ended.
    """

    tokens: list[str]
    model_mask: list[int]
    tool_mask: list[int]
    summary_mask: list[int]
    adv: dict[str, list[float]]
    tool_reward: float
    summary_reward: float
    stop_reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, r: Any, where: str = "rollout") -> "SampleRollout":
        """The rollout of a JSON object; ``ValueError`` naming ``where`` and the field when it is unusable."""
        if not isinstance(r, dict):
            raise ValueError(f"{where}: expected an object")
        toks = r.get("tokens")
        if not isinstance(toks, list):
            raise ValueError(f"{where}: field 'tokens' must be a list")
        for f in ("model_mask", "tool_mask"):
            if not isinstance(r.get(f), list) or len(r[f]) != len(toks):
                raise ValueError(f"{where}: field {f!r} must be a list as long as 'tokens' ({len(toks)})")
        adv = r.get("adv")
        if not isinstance(adv, dict):
            raise ValueError(f"{where}: field 'adv' must be an object (estimator -> advantages)")
        for e, a in adv.items():
            if not isinstance(a, list) or not all(is_finite_number(x) for x in a):
                raise ValueError(f"{where}: field 'adv.{e}' must be a list of finite numbers")
        summary_mask = r.get("summary_mask")
        if summary_mask is None:
            summary_mask = [int(bool(m) and not t) for m, t in zip(r["model_mask"], r["tool_mask"])]
        return cls(toks, r["model_mask"], r["tool_mask"], summary_mask, adv,
                   r.get("tool_reward"), r.get("summary_reward"), r.get("stop_reason", ""))

    def segment_mean(self, estimator: str, tool: bool) -> float:
        """Mean advantage ``estimator`` gives the tool (``tool=True``) or summary policy tokens (NaN when none)."""
        adv = self.adv.get(estimator, [])
        v = [float(adv[t]) for t in range(min(len(adv), len(self.tokens))) if self.model_mask[t] and bool(self.tool_mask[t]) == tool]
        return sum(v) / len(v) if v else float("nan")


@dataclass
class SampleGroup:
    """One recorded group: the task, its prompt and every rollout of the group.

    Attributes:
        step: the 1-based training step that sampled it (as in ``metrics.jsonl``).
        task, kind: the task's id and kind.
        prompt: the decoded prompt.
        rollouts: the group's rollouts.
    """

    step: int
    task: str
    kind: str
    prompt: str
    rollouts: list[SampleRollout]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, g: Any, where: str = "group") -> "SampleGroup":
        """The group of a JSON object; ``ValueError`` naming ``where``, the rollout and the field when it is unusable."""
        if not isinstance(g, dict) or not isinstance(g.get("rollouts"), list):
            raise ValueError(f"{where}: field 'rollouts' must be a list")
        rollouts = [SampleRollout.from_json(r, f"{where} rollout {ri}") for ri, r in enumerate(g["rollouts"])]
        return cls(g.get("step", ""), g.get("task", ""), g.get("kind", ""), g.get("prompt", ""), rollouts)

    def estimators(self) -> list[str]:
        """The estimators the group recorded advantages of (those of its first rollout)."""
        return list(self.rollouts[0].adv) if self.rollouts else []


def samples_to_json(groups: list[SampleGroup]) -> list[dict[str, Any]]:
    """The JSON layout of recorded groups (``samples.json``, the checkpoint's ``samples``)."""
    return [g.to_json() for g in groups]


def samples_from_json(data: Any, source: str = "samples") -> list[SampleGroup]:
    """Recorded groups of a JSON value (a list of groups); ``ValueError`` naming ``source``, group, rollout and field."""
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a list of recorded groups, got {type(data).__name__}")
    return [SampleGroup.from_json(g, f"{source}: group {gi}") for gi, g in enumerate(data)]


def read_samples(path: str | Path) -> list[SampleGroup]:
    """The recorded groups of a ``samples.json`` file (``ValueError`` when it is not JSON or not usable)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p} is not valid JSON: {e}") from None
    return samples_from_json(data, str(p))
