"""The metric vocabulary: every name a ``metrics.jsonl`` row can hold, declared once.

A :class:`Metric` is a name, what it means, the values it can take, which way is
better and how it is drawn. :mod:`slca.training.stats` and :meth:`slca.training.trainer.Trainer.evaluate`
write rows with these names; ``slca train``'s tables (:mod:`slca.cli`), the run
report (:mod:`slca.reporting.report`) and ``slca compare`` (:mod:`slca.reporting.compare`) select
from the views at the end of this module. A name with a ``{slot}`` stands for
a family (``reward/exec/{component}``: one key per reward component); the slots
and what each matches are :data:`SLOTS`. :func:`lookup` finds the declaration
of any key and refuses a key that is declared nowhere.

Evaluation metrics are logged once per evaluation set: ``eval`` is the held-out
set, ``eval_<split>`` an out-of-distribution toolworld split (the ``{set}`` slot).

    >>> lookup("eval_test/tool_tasks/success").range
    (0.0, 1.0)
    >>> REWARD_EXEC.key(component="success")
    'reward/exec/success'
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from collections.abc import Iterable, Sequence
from typing import Literal

__all__ = ["Metric", "Panel", "SLOTS", "VOCABULARY", "lookup", "metric_range", "eval_set_of", "eval_sets_of", "EVAL_SET", "TEST_SET", "AUC_PREFIX",
           "RUN_PLOTS", "with_logged_ood_split", "RUN_FINAL", "RUN_DIAGNOSTICS", "CLI_FINAL", "CLI_DIAGNOSTICS", "COMPARE_PANELS", "COMPARE_SUMMARY",
           "COMPARE_DIAGNOSTICS"]

_INF = math.inf
UNIT = (0.0, 1.0)
NONNEG = (0.0, _INF)
ANY = (-_INF, _INF)

SLOTS = {
    "set": r"eval(?:_[^/]+)?",  # eval (held out) or eval_<split> (out of distribution)
    "kind": r"[^/]+",  # Task.kind
    "component": r".+",  # a reward component's name
    "reason": r"[a-z_]+",  # a stop reason (slca.types.STOP_REASONS)
    "segment": r"tool|summary",
    "stat": r"mean|std|abs_mean",
}
"""What each ``{slot}`` of a family's name matches."""

EVAL_SET = "eval"
"""The held-out evaluation set's prefix; an out-of-distribution split ``s`` is logged under ``eval_s``."""
TEST_SET = "eval_test"
"""toolworld's out-of-distribution test split, as an evaluation set (unseen entities and phrasings)."""
AUC_PREFIX = "auc/"
"""``slca compare``'s area under a metric's curve (:func:`slca.reporting.compare.curve_auc`): ``auc/<metric>``."""


@functools.lru_cache(maxsize=None)
def _pattern(name: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", name)  # literal, slot, literal, slot, ...
    return re.compile("".join(re.escape(p) if i % 2 == 0 else f"(?:{SLOTS[p]})" for i, p in enumerate(parts)))


@dataclass(frozen=True)
class Metric:
    """One metric (or a family of them, when ``name`` has ``{slots}``).

    Attributes:
        name: the ``metrics.jsonl`` key, or its pattern (``reward/exec/{component}``).
        meaning: what the number is, in one line.
        range: (lo, hi) the values it can take, infinite where unbounded; interval bands are clipped to it.
        better: ``"higher"`` / ``"lower"`` where one direction is better, else None.
        smooth: drawn as a trailing mean in the run report (noisy per-step training curves).
        title: its panel title in plots.
        column: its column name in ``slca train``'s tables (default :attr:`in_set`).
    """

    name: str
    meaning: str
    range: tuple[float, float] = ANY
    better: Literal["higher", "lower"] | None = None
    smooth: bool = False
    title: str = ""
    column: str = ""

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\{(\w+)\}", self.name))

    def matches(self, key: str) -> bool:
        return _pattern(self.name).fullmatch(key) is not None

    def key(self, **parts: str) -> str:
        """The key of this metric with its slots filled (``EVAL_SUCCESS.key(set="eval")``)."""
        if set(parts) != set(self.slots):
            raise ValueError(f"metric {self.name!r} has slots {list(self.slots)}, got {sorted(parts)}")
        k = self.name.format(**parts)
        if not self.matches(k):
            raise ValueError(f"{k!r} is not a key of metric {self.name!r}: the slots match {({s: SLOTS[s] for s in self.slots})}")
        return k

    @property
    def in_set(self) -> str:
        """Its name within an evaluation set (``tool_tasks/success`` for ``{set}/tool_tasks/success``)."""
        return self.name.removeprefix("{set}/")

    @property
    def short(self) -> str:
        """Its column name in ``slca train``'s tables."""
        return self.column or self.in_set


# ------------------------------------------------------------------ a training step (slca.training.stats.step_metrics)

STEP = Metric("step", "the training step the row records (0: the evaluation before any update)", NONNEG)
PERF_GEN = Metric("perf/gen_tokens_per_s", "rollout tokens generated per second (wall clock)", NONNEG, "higher")
PERF_TRAIN = Metric("perf/train_tokens_per_s", "tokens through the policy update per second (wall clock)", NONNEG, "higher")
PERF_CPU = Metric("perf/cpu_s", "CPU seconds of the run's process since the row before (user + system, every thread): the "
                  "step, its evaluation, the checkpoint before it; summed over the rows, the run's cost across resumes, "
                  "each process's start (loading) and last checkpoint aside", NONNEG, "lower")
GRAD_NORM = Metric("grad/norm", "pre-clip gradient norm, mean over the step's minibatches", NONNEG, smooth=True,
                   title="gradient norm (pre-clip, mean over minibatches)")
GRAD_VOLATILITY = Metric("grad/volatility", "rolling coefficient of variation of grad/norm", NONNEG, "lower",
                         title="grad-norm volatility (rolling CV)")
GRAD_FIRST_NORM = Metric("grad/first_minibatch_norm", "pre-clip gradient norm of the first minibatch (diagnostic steps)", NONNEG)
GRAD_TOOL_NORM = Metric("grad/tool_norm", "norm of the tool-token part of the first minibatch's gradient (diagnostic steps)", NONNEG)
GRAD_SUMMARY_NORM = Metric("grad/summary_norm", "norm of the summary-token part of the first minibatch's gradient (diagnostic steps)",
                           NONNEG)
GRAD_COSINE = Metric("grad/cosine_tool_summary", "cosine of the tool-token and summary-token gradients (diagnostic steps)",
                     (-1.0, 1.0), smooth=True, title="cosine(tool grad, summary grad)", column="grad cos")
LOSS = Metric("loss", "policy loss, mean over the step's minibatches")
PPO_CLIP_FRAC = Metric("ppo/clip_frac", "share of policy tokens whose ratio was clipped, mean over minibatches", UNIT)
PPO_KL = Metric("ppo/kl", "KL estimate to the reference model, mean over minibatches (with a reference)")
LR = Metric("lr", "learning rate of the step's update", NONNEG)
REWARD_TOOL = Metric("reward/tool", "execution-tier reward, batch mean (reward=paper: -0.5 for a rollout that makes no needed call)",
                     (-0.5, 1.0), "higher", smooth=True, title="execution reward (train)")  # -0.5: slca.rewards.paper.NO_CALL_PENALTY
REWARD_SUMMARY = Metric("reward/summary", "summary-tier reward, batch mean", UNIT, "higher", smooth=True,
                        title="summary reward (train)")
REWARD_UNSCORED = Metric("reward/unscored", "rewards of the batch that could not be scored (NaN), both tiers", NONNEG, "lower",
                         smooth=True)
REWARD_EXEC = Metric("reward/exec/{component}", "an execution-tier reward component, batch mean", UNIT, smooth=True)
REWARD_SUMMARY_PART = Metric("reward/summary/{component}", "a summary-tier reward component, batch mean", UNIT, smooth=True)
REWARD_TURN = Metric("reward/turn", "per-turn reward, mean over the batch's turns (estimators with turn rewards)", UNIT, smooth=True)
ADV_STAT = Metric("adv/{segment}_{stat}", "mean / std / mean |A| of the advantages on one segment's tokens")
ADV_CONTAMINATION = Metric("adv/contamination", "advantage contamination: summary-reward credit that reached tool tokens", NONNEG,
                           "lower", title="advantage contamination", column="contamination")
ADV_COND_FRAC = Metric("adv/cond_subgroup_frac", "share of rollouts normalised within a tool-signature subgroup", UNIT)
ROLLOUT_TOKENS = Metric("rollout/response_tokens", "response tokens (policy and environment) per rollout", NONNEG)
ROLLOUT_POLICY_FRAC = Metric("rollout/policy_token_frac", "share of response tokens the policy sampled", UNIT)
ROLLOUT_TOOL_TURNS = Metric("rollout/tool_turns", "tool calls per rollout", NONNEG)
ROLLOUT_STOP = Metric("rollout/stop_{reason}", "share of rollouts that stopped for this reason", UNIT)
ROLLOUT_NO_TOOL = Metric("rollout/no_tool_segment", "share of rollouts with no tool segment", UNIT)
ROLLOUT_NO_SUMMARY = Metric("rollout/no_summary_segment", "share of rollouts with a tool segment and no summary segment", UNIT)
ROLLOUT_MIXED = Metric("rollout/mixed_call_groups", "share of groups where some rollouts have a tool segment and some not", UNIT)
ROLLOUT_MASK_MISMATCH = Metric("rollout/mask_mismatch", "share of rollouts whose segment masks disagree with their "
                               "conversation (slca.chat.maskcheck; mask_check_max_mismatch stops the run above it)", UNIT, "lower")
ROLLOUT_SPAN_MOVED = Metric("rollout/span_moved", "share of the environment-boundary execution segment's tokens that "
                            "segmentation='span' gives the summary advantage (text around a turn's calls); logged with span only", UNIT)

# ------------------------------------------------------------------ TRL's trainer (slca.integrations.trl), its own log names

TRL_TOOL_REWARD = Metric("slca/tool_reward_mean", "execution-tier reward, mean over TRL's gathered batch")
TRL_SUMMARY_REWARD = Metric("slca/summary_reward_mean", "summary-tier reward, mean over TRL's gathered batch")
TRL_TOOL_TOKEN_FRAC = Metric("slca/tool_token_frac", "share of policy tokens in the tool segment, TRL's gathered batch", UNIT)
TRL_ADV_ABS = Metric("slca/{segment}_adv_abs_mean", "mean |advantage| on one segment's tokens, TRL's gathered batch", NONNEG)

# ------------------------------------------------------------------ evaluation (Trainer.evaluate), per set

EVAL_SUCCESS = Metric("{set}/success", "normalised calls equal the gold calls and all executed", UNIT, "higher")
EVAL_PAPER_SUCCESS = Metric("{set}/paper_success", "the authors' Success@0.9: (process + summary) / 2 >= 0.9 by their reward, "
                            "slca's rule summary tier standing in for their judge", UNIT, "higher", column="paper success")
EVAL_NAME_F1 = Metric("{set}/name_f1", "F1 of called vs gold tool names", UNIT, "higher")
EVAL_ARG_MATCH = Metric("{set}/arg_match", "agreement of matched calls' arguments with the gold ones", UNIT, "higher")
EVAL_PROCESS = Metric("{set}/process", "share of gold steps whose calls appear in order", UNIT, "higher")
EVAL_PARSE_OK = Metric("{set}/parse_ok", "share of rollouts with no parse error in any turn", UNIT, "higher")
EVAL_PARALLEL_SPLIT = Metric("{set}/parallel_split", "share of parallel tasks whose calls were spread over more turns than steps",
                             UNIT, "lower", column="parallel split")
EVAL_TOOL_TASKS = Metric("{set}/tool_tasks/success", "success on the tasks that need at least one call", UNIT, "higher",
                         column="tool-task success")
EVAL_KIND_SUCCESS = Metric("{set}/kind/{kind}/success", "success on one task kind", UNIT, "higher")
EVAL_KIND_SUMMARY = Metric("{set}/kind/{kind}/reward_summary", "summary reward on one task kind", UNIT, "higher")
EVAL_REWARD_TOOL = Metric("{set}/reward_tool", "execution-tier reward of the greedy rollouts", UNIT, "higher")
EVAL_REWARD_SUMMARY = Metric("{set}/reward_summary", "summary-tier reward of the greedy rollouts", UNIT, "higher",
                             column="summary reward")
EVAL_IN_DOMAIN = {"name_f1": EVAL_NAME_F1, "arg_match": EVAL_ARG_MATCH, "process": EVAL_PROCESS, "success": EVAL_SUCCESS,
                  "parse_ok": EVAL_PARSE_OK, "parallel_split": EVAL_PARALLEL_SPLIT, "paper_success": EVAL_PAPER_SUCCESS}
"""The metrics of :func:`slca.rewards.eval_scores` (one evaluation rollout's scores), by the name it returns them under."""
PROBE_LOGP_PARALLEL = Metric("probe/logp_parallel", "log p(the first parallel step in one turn), held-out mean", (-_INF, 0.0))
PROBE_LOGP_SEQUENTIAL = Metric("probe/logp_sequential", "log p(its first call alone), held-out mean", (-_INF, 0.0))
PROBE_PARALLEL_PREF = Metric("probe/parallel_pref", "probe/logp_parallel - probe/logp_sequential (the paper's diagnostic case)",
                             ANY, "higher", title="log p(parallel turn) - log p(first call alone)")
AUC_TOOL_TASKS = Metric(AUC_PREFIX + "{set}/tool_tasks/success", "area under the tool-task success curve / its span (slca compare)",
                        UNIT, "higher")

VOCABULARY: tuple[Metric, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Metric))  # the declarations above
"""Every metric, in declaration order."""
_BY_NAME = {m.name: m for m in VOCABULARY if not m.slots}


def lookup(key: str) -> Metric:
    """The declaration of ``key`` (a metric's name, or a key of a family); ValueError naming a key declared nowhere."""
    if key in _BY_NAME:
        return _BY_NAME[key]
    found = [m for m in VOCABULARY if m.slots and m.matches(key)]
    if len(found) != 1:
        what = "declared nowhere in slca.metrics" if not found else f"matched by {[m.name for m in found]}"
        raise ValueError(f"metric {key!r} is {what}")
    return found[0]


def metric_range(key: str) -> tuple[float, float]:
    """The values ``key`` can take: (lo, hi), infinite where unbounded."""
    return lookup(key).range


def eval_set_of(key: str) -> str | None:
    """The evaluation set ``key`` belongs to (``eval``, ``eval_<split>``), None for a training metric."""
    head = key.split("/")[0]
    return head if re.fullmatch(SLOTS["set"], head) else None


def eval_sets_of(keys) -> list[str]:
    """The evaluation sets among ``keys``, in order: ``eval`` first, then each ``eval_<split>``."""
    found = {s for s in map(eval_set_of, keys) if s is not None}
    return sorted(found, key=lambda p: (p != EVAL_SET, p))


# ------------------------------------------------------------------ views: what each output selects


@dataclass(frozen=True)
class Panel:
    """One plot panel: a metric key and its title (the metric's own title unless the view needs another)."""

    key: str
    title: str = ""

    def __post_init__(self):
        m = lookup(self.key)  # refuses a key declared nowhere, at import
        if not self.title:
            if not m.title:
                raise ValueError(f"panel {self.key!r} needs a title: metric {m.name!r} declares none")
            object.__setattr__(self, "title", m.title)


_HELD_OUT = EVAL_TOOL_TASKS.key(set=EVAL_SET)
_TEST = EVAL_TOOL_TASKS.key(set=TEST_SET)

RUN_PLOTS = (
    Panel(REWARD_TOOL.name), Panel(REWARD_SUMMARY.name),
    Panel(_HELD_OUT, "held-out tool-task Success\n(eval/: in distribution for toolworld)"),
    Panel(EVAL_PARALLEL_SPLIT.key(set=EVAL_SET), "held-out parallel steps split over turns\n(the paper's diagnostic case; lower is better)"),
    Panel(EVAL_REWARD_SUMMARY.key(set=EVAL_SET), "held-out summary reward"),
    Panel(_TEST, "tool-task Success, toolworld test split\n(unseen entities and phrasings: out of distribution)"),
    Panel(GRAD_COSINE.name), Panel(GRAD_VOLATILITY.name), Panel(ADV_CONTAMINATION.name), Panel(GRAD_NORM.name),
)
"""The run report's panels (``curves.png``, :func:`slca.reporting.report.write_report`), one line per run."""
RUN_FINAL = (EVAL_SUCCESS, EVAL_PAPER_SUCCESS, EVAL_TOOL_TASKS, EVAL_NAME_F1, EVAL_ARG_MATCH, EVAL_PROCESS, EVAL_PARALLEL_SPLIT, EVAL_REWARD_TOOL,
             EVAL_REWARD_SUMMARY, EVAL_PARSE_OK)
"""The run report's final-metrics columns, per evaluation set."""
RUN_DIAGNOSTICS = (GRAD_COSINE, GRAD_VOLATILITY, ADV_CONTAMINATION, PERF_GEN, PERF_TRAIN)
"""The run report's diagnostics (means over steps)."""
CLI_FINAL = (EVAL_SUCCESS, EVAL_TOOL_TASKS, EVAL_NAME_F1, EVAL_ARG_MATCH, EVAL_PARALLEL_SPLIT, EVAL_REWARD_SUMMARY)
"""``slca train`` / ``slca demo`` tables: final metrics per evaluation set (column names: :attr:`Metric.short`)."""
CLI_DIAGNOSTICS = (ADV_CONTAMINATION, GRAD_COSINE)
"""``slca train`` / ``slca demo`` tables: the diagnostics (means over steps) beside the held-out set."""
COMPARE_PANELS = (
    Panel(_HELD_OUT, "held-out tool-task Success (eval/)"),
    Panel(EVAL_PARALLEL_SPLIT.key(set=EVAL_SET), "held-out parallel steps split over turns"),
    Panel(_TEST, "tool-task Success, toolworld test split (OOD)"),
    Panel(REWARD_TOOL.name), Panel(REWARD_SUMMARY.name), Panel(PROBE_PARALLEL_PREF.name), Panel(GRAD_VOLATILITY.name),
    Panel(GRAD_COSINE.name), Panel(ADV_CONTAMINATION.name),
)
"""``slca compare``'s panels (``curves_compare.png``): one line per estimator with its band."""


def with_logged_ood_split(panels: Sequence[Panel], keys: Iterable[str]) -> list[Panel]:
    """``panels`` with the out-of-distribution panel (toolworld's ``test`` split) drawn for the split the runs
    logged: kept when ``keys`` hold ``eval_test``'s tool-task Success; else the first other ``eval_<split>``
    that has it (``slca demo`` evaluates ``fresh``), titled with that split; kept as it is when there is none."""
    keys = set(keys)
    sets = [s for s in eval_sets_of(keys) if s not in (EVAL_SET, TEST_SET) and EVAL_TOOL_TASKS.key(set=s) in keys]
    if _TEST in keys or not sets:
        return list(panels)
    split = sets[0][len(EVAL_SET) + 1:]
    return [Panel(EVAL_TOOL_TASKS.key(set=sets[0]), f"tool-task Success, toolworld {split} split\n(out of distribution)")
            if p.key == _TEST else p for p in panels]
COMPARE_SUMMARY = (AUC_TOOL_TASKS.key(set=EVAL_SET), _HELD_OUT, EVAL_SUCCESS.key(set=EVAL_SET), EVAL_ARG_MATCH.key(set=EVAL_SET),
                   EVAL_PARALLEL_SPLIT.key(set=EVAL_SET), EVAL_REWARD_SUMMARY.key(set=EVAL_SET), _TEST)
"""``slca compare``'s per-run numbers: the area under the held-out tool-task Success curve, final held-out
metrics and the final tool-task Success on toolworld's out-of-distribution test split."""
COMPARE_DIAGNOSTICS = tuple(m.name for m in (GRAD_VOLATILITY, GRAD_COSINE, ADV_CONTAMINATION, GRAD_TOOL_NORM, GRAD_SUMMARY_NORM))
"""``slca compare``'s diagnostics (means over training steps)."""
