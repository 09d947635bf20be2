"""The authors' reward, as a preset beside slca's own tiers (``TrainConfig.reward = "paper"``).

The paper's authors released the reward they trained with (repository ``SLCA-GRPO/SLCA-GRPO``,
commit 68539c5, Apache-2.0: ``rl/slca_grpo/reward_fn.py``), and the rewards of the two baselines
they compare with (``baselines/toolpo/reward_fn_toolpo.py``, ``baselines/rltr/reward_fn_rltr.py``).
slca's own tiers (:mod:`slca.rewards.execution`, :mod:`slca.rewards.summary`) are another reading
of the paper's HierR. This module restates the authors' rules on slca's types; it copies no code.

Mapping. Their reward reads one completion string with regular expressions; here the rollout
is already parsed (:class:`slca.types.Turn`):

* a ``<tool_call>`` block is one **tool turn** (``turn.parsed.is_tool_turn``), and the block's
  calls are the turn's well-formed calls. A parallel step written in one turn is one block of
  several calls, as their own smoke test writes it (a JSON list in one block). (Their regex
  would count a Hermes turn of k separate tags as k blocks of one call each; slca reads the turn.)
* a block is **valid** when its turn has no blocking parse error (``turn.parsed.blocking_errors``:
  invalid JSON, an unclosed tag, a call that is not an object, ...) and every call names an
  offered tool. As in theirs, an invalid block's calls count nowhere (not in ``P``, not in any
  block). The number of tool turns stands for their ``max(open tags, close tags)``.
* "no ``<tool_call>`` tag at all" is **no attempt**: no turn has a call or a blocking parse error.
  slca's parser counts every blocking error as an attempt (an unclosed ``<think>`` included).
* ``<tool_response>`` blocks are the turns' results (``turn.results``, as
  :meth:`slca.types.ToolResult.to_text` writes them), error answers included; the final response
  is the rollout's ``final_text``; their ``question_content`` is the task's user messages; the
  allowed tools are the names of ``task.tools``; gold is ``task.gold`` (empty steps skipped).
* ``<think>`` text is the turn's ``reasoning``, which the parser keeps out of the calls, as theirs
  strips it before parsing.

Process score (the execution tier; goes to the tool tokens). With ``P`` the calls of the valid
blocks in order, ``G`` the gold calls, ``B`` the valid blocks, ``T`` the tool turns:

* ``format``      = ``|B| / T`` (0 when ``T = 0``);
* ``name_f1``     = F1 of the multisets of names in ``P`` and ``G`` (1 when both are empty);
* ``key_match``   and ``value_match``: every gold call with arguments ``g`` (in gold order) takes
  the unused same-name call ``p`` of ``P`` with the highest ``key + value`` (the first on ties,
  none when that is 0), ``key = |K_p ∩ K_g| / |K_p ∪ K_g|`` (0 when ``p`` has no argument),
  ``value = |{k ∈ K_p ∩ K_g : p[k] ≈ g[k]}| / |K_g|`` (≈: :func:`loose_equal`); each component is
  the mean over those gold calls (1 when no gold call has arguments, 0 when ``P`` is empty);
* ``parallel``    = 1 when the first valid block holds as many calls as the first gold step
  (0 calls when there is none of either), else 0;

    process = 0.10 format + 0.25 name_f1 + 0.15 key_match + 0.20 value_match + 0.30 parallel.

Summary score (the summary tier; goes to the summary tokens): 0 when the rollout has no tool
response, 0 when the final response is shorter than 10 characters (stripped), else the judge's
rating ``r`` (very poor .. excellent = 1 .. 5) as ``(r - 1) / 4`` (:class:`PaperJudge`, their rubric).
Where no judge is served, slca's rule summary tier (:func:`slca.rewards.summary_reward`) stands in
for the rating (component ``rule_stand_in`` = 1). A judge that fails gives NaN with its reason
(slca's rule); ``judge_failure_score=0.0`` gives their ``JUDGE_FAILURE_SCORE`` instead.

No-call penalty. When gold needs calls and the rollout attempted none, their ``score`` is
``NO_CALL_PENALTY = -0.5`` (with process and summary scores 0): here the execution tier carries
-0.5 (component ``no_call`` = 1) and the summary tier 0. Otherwise

    score = W_PROCESS * process + W_SUMMARY * summary        (both weights 1.0)

so with ``tool_weight = summary_weight = 1`` (the trainer's defaults) the two tiers sum to their
``score`` on every path. Their ``process_score`` is 0 on the penalty path; the -0.5 sits on the tool
tier here only so that the sum is exact: such a rollout has no tool segment, so no tool token
carries it (and the estimator's ``should_no_call`` guard zeroes it anyway).
``weighted_score_norm = max(0, score / (W_PROCESS + W_SUMMARY))`` and their Success@0.9 is
``weighted_score_norm >= 0.9`` (:func:`paper_success`).

Estimator inputs (one float per rollout, ``fn(trajectories) -> (B,)`` float32, NaN for a task that
cannot be scored): :func:`should_no_call`, :func:`toolpo_correct_ratio` (ToolPO's ``C(a_t^call)``),
:func:`rltr_comp`, :func:`rltr_repeat_penalty`, :func:`rltr_error_penalty`, :func:`rltr_format_valid`
(RLTR's terms). RLTR's ``R_comp`` is an LLM checker's 0/1 verdict averaged over N samples; no
checker is served in training, so :func:`rltr_comp` is a rule stand-in (every gold step made).

A task that offers no tools (their ``missing_allowed_tools``, scored 0 there) or whose tool schema
has no name cannot be scored: NaN with the reason, never a silent 0.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from slca.rewards.common import Unscorable, check_turns, gold_calls
from slca.rewards.execution import _process
from slca.rewards.judges import OpenAIJudge
from slca.rewards.summary import summary_reward
from slca.types import RewardBreakdown, Task, ToolCall, ToolSpec, Trajectory, Turn

__all__ = [
    "PROCESS_WEIGHTS", "W_PROCESS", "W_SUMMARY", "NO_CALL_PENALTY", "MIN_ANSWER_CHARS", "SUCCESS_THRESHOLD", "RATINGS",
    "RLTR_LAMBDA_REPEAT", "RLTR_MU_ERROR", "PAPER_JUDGE_PROMPT", "SUMMARY_COMPONENTS",
    "PaperJudge", "paper_judge_messages", "parse_rating", "loose_equal",
    "paper_process_score", "paper_summary_score", "paper_rewards", "paper_total", "paper_score_norm", "paper_success",
    "paper_inputs", "should_no_call", "toolpo_correct_ratio", "rltr_comp", "rltr_repeat_penalty", "rltr_error_penalty",
    "rltr_format_valid",
]

log = logging.getLogger("slca.rewards")

#: Process sub-weights (their ``SLCA_WEIGHT_FORMAT / NAME / KEY / VALUE / PARALLEL``); they sum to 1.
PROCESS_WEIGHTS: dict[str, float] = {"format": 0.10, "name_f1": 0.25, "key_match": 0.15, "value_match": 0.20, "parallel": 0.30}
#: Weight of the process score in ``score`` (their ``SLCA_WEIGHT_PROCESS``).
W_PROCESS = 1.0
#: Weight of the summary score in ``score`` (their ``SLCA_WEIGHT_RESPQ``).
W_SUMMARY = 1.0
#: ``score`` of a rollout that makes no call where gold needs one (their ``NO_CALL_PENALTY``).
NO_CALL_PENALTY = -0.5
#: A final response shorter than this (characters, stripped) scores 0 without a judge.
MIN_ANSWER_CHARS = 10
#: Their Success@0.9: ``weighted_score_norm >= SUCCESS_THRESHOLD``.
SUCCESS_THRESHOLD = 0.9
#: The judge's ratings and their points (``(r - 1) / 4`` is the summary score).
RATINGS: dict[str, int] = {"very poor": 1, "poor": 2, "acceptable": 3, "good": 4, "excellent": 5}
#: RLTR's coefficients (their ``RLTR_LAMBDA_REPEAT``, ``RLTR_MU_ERROR`` defaults).
RLTR_LAMBDA_REPEAT = 0.1
RLTR_MU_ERROR = 0.2

SUMMARY_COMPONENTS = ("response_quality", "rule_stand_in", "no_tool_response", "short_answer", "judge_failed")
"""The summary tier's components: the score used, whether slca's rule tier stood in for the judge,
and which of their zero paths (no tool response, a short answer, a failed judge) applied."""

# The authors' response-quality rubric (rl/slca_grpo/reward_fn.py, LLM_JUDGE_PROMPT_TEMPLATE): restated
# word for word, since a judge's ratings depend on its prompt. Sent as one user message.
PAPER_JUDGE_PROMPT = """## Task
Evaluate the quality of an AI assistant's final response based on the tool results it received.

## Assessment Criteria
### Response Quality (1-5 scale)
- 1 (very poor): Response is completely wrong, irrelevant, or ignores tool results
- 2 (poor): Seriously misinterprets tool results or misses critical information
- 3 (acceptable): Basically correct but has minor errors or incomplete coverage
- 4 (good): Correctly uses tool results, response is clear and complete
- 5 (excellent): Perfect interpretation of results, professional and helpful response

## User Question
```
{question}
```

## Tool Results
```
{tool_results}
```

## Model's Final Response
```
{final_response}
```

## Evaluation Points
1. **Result Interpretation**: Does the model correctly understand and explain the data returned by tools?
2. **Information Completeness**: Does the response address all parts of the user's question based on the tool results?
3. **Expression Quality**: Is the response clear, well-organized, and helpful to the user?

## Output Format
<response>
  <response_quality>
    <reasoning>Brief analysis of the response quality based on the three evaluation points above.</reasoning>
    <rating><!-- one of: very poor, poor, acceptable, good, excellent --></rating>
  </response_quality>
</response>
"""

_RATING = re.compile(r"<response_quality>.*?<rating>(.*?)</rating>.*?</response_quality>", re.DOTALL | re.IGNORECASE)


# ------------------------------------------------------------------ reading a rollout as their parser would


@dataclass(frozen=True)
class _Blocks:
    """A rollout read as their ``<tool_call>`` blocks (module docstring, Mapping).

    Attributes:
        gold: the non-empty gold steps, in order.
        n_blocks: tool turns (their ``max(open tags, close tags)``).
        valid: the calls of each valid block, in order.
    """

    gold: list[list[ToolCall]]
    n_blocks: int
    valid: list[list[ToolCall]]

    @property
    def calls(self) -> list[ToolCall]:
        """``P``: the calls of the valid blocks, in order."""
        return [c for b in self.valid for c in b]

    @property
    def gold_calls(self) -> list[ToolCall]:
        return [c for s in self.gold for c in s]

    @property
    def no_call(self) -> bool:
        """Gold needs a call and the rollout attempted none (their ``should_call_but_no_call``)."""
        return bool(self.gold) and self.n_blocks == 0

    @property
    def format_valid(self) -> bool:
        """Every block is valid (their ``format_fully_passed``; true with no block)."""
        return len(self.valid) == self.n_blocks


def _allowed_tools(task: Task) -> set[str]:
    """The names of the offered tools; :class:`Unscorable` when there are none or a schema has no name."""
    if not task.tools:
        raise Unscorable(f"task {task.id!r} offers no tools (the authors' reward returns its error result here)")
    try:
        return {ToolSpec.from_openai(t).name for t in task.tools}
    except (ValueError, AttributeError, TypeError) as e:
        raise Unscorable(f"task {task.id!r} has a tool schema without a name: {e}") from None


def _read(task: Task, turns: list[Turn]) -> _Blocks:
    """The rollout as their blocks; :class:`Unscorable` when the task cannot be scored (ValueError on caller bugs)."""
    check_turns(turns)
    gold_calls(task)  # ValueError naming a gold step that holds a non-call
    allowed = _allowed_tools(task)
    tool_turns = [t for t in turns if t.parsed.is_tool_turn]
    valid = [list(t.parsed.calls) for t in tool_turns
             if not t.parsed.blocking_errors and all(c.name in allowed for c in t.parsed.calls)]
    return _Blocks(gold=[list(s) for s in task.gold if s], n_blocks=len(tool_turns), valid=valid)


# ------------------------------------------------------------------ the process score


def loose_equal(pred: Any, gold: Any) -> bool:
    """Their loose value equality, in order: both None; the same text after ``str``, strip and lower case;
    the same number (``10 == "10" == 10.0``, within 1e-9); the same truth value read from
    ``"true" / "false" / "1" / "0"`` (``"true" == True``; two such values that differ are unequal);
    two lists or dicts with the same sorted-key JSON. Anything else is unequal."""
    if pred is None or gold is None:
        return pred is None and gold is None
    ps, gs = str(pred).strip().lower(), str(gold).strip().lower()
    if ps == gs:
        return True
    try:
        if abs(float(pred) - float(gold)) < 1e-9:
            return True
    except (TypeError, ValueError, OverflowError):
        pass
    truth = {"true": True, "false": False, "1": True, "0": False}
    if ps in truth and gs in truth:
        return truth[ps] == truth[gs]
    if isinstance(pred, (list, dict)) and isinstance(gold, (list, dict)):
        try:
            return json.dumps(pred, sort_keys=True) == json.dumps(gold, sort_keys=True)
        except (TypeError, ValueError):
            return False
    return False


def _name_f1(pred: list[ToolCall], gold: list[ToolCall]) -> float:
    """F1 of the multisets of call names (1 when both are empty, 0 when one is)."""
    if not pred or not gold:
        return float(not pred and not gold)
    tp = sum((Counter(c.name for c in pred) & Counter(c.name for c in gold)).values())
    return 2 * tp / (len(pred) + len(gold))


def _key_value_match(pred: list[ToolCall], gold: list[ToolCall]) -> tuple[float, float]:
    """``(key_match, value_match)``: the greedy pairing of the module docstring."""
    with_args = [g for g in gold if g.arguments]
    if not with_args:
        return 1.0, 1.0
    if not pred:
        return 0.0, 0.0
    used: set[int] = set()
    key_sum = value_sum = 0.0
    for g in with_args:
        gk = set(g.arguments)
        best, best_i = (0.0, 0.0), -1
        for i, p in enumerate(pred):
            if i in used or p.name != g.name:
                continue
            pk = set(p.arguments)
            key = len(pk & gk) / len(pk | gk) if pk else 0.0
            value = sum(loose_equal(p.arguments[k], g.arguments[k]) for k in pk & gk) / len(gk)
            if key + value > sum(best):
                best, best_i = (key, value), i
        if best_i >= 0:
            used.add(best_i)
        key_sum += best[0]
        value_sum += best[1]
    return key_sum / len(with_args), value_sum / len(with_args)


def _process_components(b: _Blocks) -> dict[str, float]:
    pred, gold = b.calls, b.gold_calls
    key, value = _key_value_match(pred, gold)
    first_gold = len(b.gold[0]) if b.gold else 0
    first_pred = len(b.valid[0]) if b.valid else 0
    return {
        "format": len(b.valid) / b.n_blocks if b.n_blocks else 0.0,
        "name_f1": _name_f1(pred, gold),
        "key_match": key,
        "value_match": value,
        "parallel": float(first_gold == first_pred),
    }


def _nan(reason: str, keys) -> RewardBreakdown:
    log.warning("reward is NaN: %s", reason)
    return RewardBreakdown(total=math.nan, components={k: math.nan for k in keys}, reason=reason)


_PROCESS_KEYS = (*PROCESS_WEIGHTS, "no_call")


def paper_process_score(task: Task, turns: list[Turn]) -> RewardBreakdown:
    """The authors' process score of one rollout: the execution tier of the ``paper`` preset.

    ``total = Σ_k PROCESS_WEIGHTS[k] * c_k`` in [0, 1] over ``c = (format, name_f1, key_match,
    value_match, parallel)`` (module docstring); :data:`NO_CALL_PENALTY` (-0.5) with every component
    0 and ``no_call`` = 1 when gold needs calls and the rollout attempted none; NaN with the reason
    when the task cannot be scored.

    Args:
        task: the task (``gold`` steps, ``tools``: their names are the allowed tools).
        turns: the rollout's assistant turns in order.

    Returns:
        ``RewardBreakdown(total, {format, name_f1, key_match, value_match, parallel, no_call})``.
    """
    try:
        b = _read(task, turns)
    except Unscorable as e:
        return _nan(str(e), _PROCESS_KEYS)
    if b.no_call:
        return RewardBreakdown(total=NO_CALL_PENALTY, components={**{k: 0.0 for k in PROCESS_WEIGHTS}, "no_call": 1.0})
    comp = _process_components(b)
    return RewardBreakdown(total=sum(PROCESS_WEIGHTS[k] * comp[k] for k in PROCESS_WEIGHTS), components={**comp, "no_call": 0.0})


# ------------------------------------------------------------------ the summary score and its judge


def _request(task: Task) -> str:
    return "\n".join(m["content"] for m in task.messages if m.get("role") == "user" and isinstance(m.get("content"), str))


def _tool_results_text(turns: list[Turn]) -> str:
    """Their ``[Tool Response i]`` listing: every result of every turn, in order."""
    results = [r for t in turns for r in t.results]
    return "\n\n".join(f"[Tool Response {i}]\n{r.to_text().strip()}" for i, r in enumerate(results, 1))


def paper_judge_messages(task: Task, turns: list[Turn], final_text: str) -> list[dict[str, str]]:
    """What :class:`PaperJudge` sends: :data:`PAPER_JUDGE_PROMPT` filled with the user's question, the
    tool results (``[Tool Response i]`` then the result's text, for every result in order) and the
    final response, as one user message."""
    body = PAPER_JUDGE_PROMPT.format(question=_request(task), tool_results=_tool_results_text(turns), final_response=final_text)
    return [{"role": "user", "content": body}]


def parse_rating(text: str) -> str | None:
    """The rating of a judge reply: the text of ``<rating>`` inside ``<response_quality>`` (case-insensitive),
    stripped and lower-cased, if it is one of :data:`RATINGS`; else None."""
    m = _RATING.search(text)
    if m is None:
        return None
    rating = m.group(1).strip().lower()
    return rating if rating in RATINGS else None


class PaperJudge(OpenAIJudge):
    """The authors' response-quality judge over an OpenAI-compatible endpoint: their rubric
    (:func:`paper_judge_messages`) and their rating, read by :func:`parse_rating` and scored
    ``(r - 1) / 4`` (very poor 0, poor 0.25, acceptable 0.5, good 0.75, excellent 1).

    A :class:`~slca.rewards.judges.Judge`: pass it to :func:`paper_summary_score` (or to slca's
    :func:`~slca.rewards.summary_reward`). Options are :class:`~slca.rewards.judges.OpenAIJudge`'s;
    ``max_retries`` defaults to 0, as theirs does not ask again after a reply without a rating (their
    HTTP retries are the client's ``http_attempts``); ``temperature`` 0, as theirs (their requests also
    cap the reply at 8192 tokens: ``max_tokens=8192``). A reply without a rating counts as
    ``invalid_output``; when no rating comes, :class:`Unscorable` is raised.
    """

    def __init__(self, base_url: str, model: str, *, max_retries: int = 0, **kwargs: Any):
        super().__init__(base_url, model, max_retries=max_retries, **kwargs)

    def messages(self, task: Task, turns: list[Turn], final_text: str) -> list[dict[str, str]]:
        return paper_judge_messages(task, turns, final_text)

    def read_reply(self, text: str) -> float:
        rating = parse_rating(text)
        if rating is None:
            raise ValueError(f"judge reply has no rating ({', '.join(RATINGS)}): {self.client.redact(text[:100])!r}")
        return (RATINGS[rating] - 1) / 4


def _summary(total: float, **flags: float) -> RewardBreakdown:
    """A summary breakdown: ``response_quality`` = ``total``, the named flags set, the other components 0."""
    comp = dict.fromkeys(SUMMARY_COMPONENTS, 0.0)
    comp.update(flags, response_quality=total)
    return RewardBreakdown(total=total, components=comp)


def paper_summary_score(task: Task, turns: list[Turn], final_text: str, *, judge: Any | None = None,
                        judge_failure_score: float | None = None) -> RewardBreakdown:
    """The authors' summary score of one rollout: the summary tier of the ``paper`` preset, in [0, 1].

    In order: 0 on the no-call path (gold needs calls, none attempted); 0 when no turn has a tool
    result (``no_tool_response`` = 1); 0 when ``final_text`` is shorter than :data:`MIN_ANSWER_CHARS`
    characters, stripped (``short_answer`` = 1); else the judge's score, or, without a judge, slca's
    rule summary tier (:func:`~slca.rewards.summary_reward`, ``rule_stand_in`` = 1).

    Args:
        task: the task.
        turns: the rollout's assistant turns with their results.
        final_text: the final response.
        judge: a :class:`~slca.rewards.judges.Judge` (:class:`PaperJudge` is their rubric); None: the
            rule tier stands in.
        judge_failure_score: the score when the judge fails (:class:`Unscorable`): None (default)
            gives NaN with the reason, slca's rule; 0.0 is their ``JUDGE_FAILURE_SCORE``.

    Returns:
        ``RewardBreakdown(total, {response_quality, rule_stand_in, no_tool_response, short_answer,
        judge_failed})``; ``total`` equals ``response_quality``.
    """
    if not isinstance(final_text, str):
        raise ValueError(f"final_text must be a str, got {type(final_text).__name__}")
    if judge_failure_score is not None and not (isinstance(judge_failure_score, (int, float)) and math.isfinite(judge_failure_score)):
        raise ValueError(f"judge_failure_score must be a finite number or None, got {judge_failure_score!r}")
    try:
        b = _read(task, turns)
    except Unscorable as e:
        return _nan(str(e), SUMMARY_COMPONENTS)
    if b.no_call:
        return _summary(0.0)
    if not any(t.results for t in turns):
        return _summary(0.0, no_tool_response=1.0)
    if len(final_text.strip()) < MIN_ANSWER_CHARS:
        return _summary(0.0, short_answer=1.0)
    if judge is None:
        rule = summary_reward(task, turns, final_text)
        if math.isnan(rule.total):
            return _nan(rule.reason or f"task {task.id!r}: the rule summary tier is NaN", SUMMARY_COMPONENTS)
        return _summary(rule.total, rule_stand_in=1.0)
    try:
        q = float(judge.score(task, turns, final_text))
    except Unscorable as e:
        if judge_failure_score is None:
            reason = f"task {task.id!r}: judge failed: {e}"
            log.warning("reward is NaN: %s", reason)
            nan = _summary(math.nan, judge_failed=1.0)
            return RewardBreakdown(total=nan.total, components=nan.components, reason=reason)
        return _summary(float(judge_failure_score), judge_failed=1.0)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"judge returned {q}, expected a score in [0, 1]")
    return _summary(q)


def paper_rewards(traj: Trajectory, *, judge: Any | None = None, judge_failure_score: float | None = None
                  ) -> tuple[RewardBreakdown, RewardBreakdown]:
    """``(paper_process_score, paper_summary_score)`` of a finished rollout: the ``paper`` preset's two tiers
    (:func:`slca.rewards.score_batch` with ``reward="paper"``)."""
    return (
        paper_process_score(traj.task, traj.turns),
        paper_summary_score(traj.task, traj.turns, traj.final_text, judge=judge, judge_failure_score=judge_failure_score),
    )


def paper_total(execution: RewardBreakdown, summary: RewardBreakdown) -> float:
    """Their ``score``: ``W_PROCESS * execution.total + W_SUMMARY * summary.total`` (-0.5 on the no-call path)."""
    return W_PROCESS * execution.total + W_SUMMARY * summary.total


def paper_score_norm(execution: RewardBreakdown, summary: RewardBreakdown) -> float:
    """Their ``weighted_score_norm``: ``max(0, score / (W_PROCESS + W_SUMMARY))`` (NaN stays NaN)."""
    norm = paper_total(execution, summary) / (W_PROCESS + W_SUMMARY)
    return norm if math.isnan(norm) else max(0.0, norm)


def paper_success(task: Task, turns: list[Turn], final_text: str, *, judge: Any | None = None,
                  judge_failure_score: float | None = None) -> float:
    """Their Success@0.9 of one rollout: 1.0 when ``weighted_score_norm >= 0.9``, else 0.0; NaN when a tier is NaN.

    Without a judge the summary score is slca's rule tier (:func:`paper_summary_score`), so this is
    their Success with the rule tier standing in for their LLM judge.
    """
    e = paper_process_score(task, turns)
    s = paper_summary_score(task, turns, final_text, judge=judge, judge_failure_score=judge_failure_score)
    norm = paper_score_norm(e, s)
    return math.nan if math.isnan(norm) else float(norm >= SUCCESS_THRESHOLD)


# ------------------------------------------------------------------ the baselines' per-rollout inputs


def _toolpo_ratio(pred: list[ToolCall], gold: list[ToolCall]) -> float:
    """ToolPO's ``Σ C(a_t^call) / |G|``: each gold call in order takes the first unused call of ``pred`` with its
    name whose arguments hold every gold key with a loosely equal value (a gold call without arguments: the
    name alone); ``C`` = 1 when one is found. 1 when gold has no call; 0 when ``pred`` is empty."""
    if not gold:
        return 1.0
    used: set[int] = set()
    correct = 0
    for g in gold:
        for i, p in enumerate(pred):
            if i in used or p.name != g.name:
                continue
            if all(k in p.arguments and loose_equal(p.arguments[k], g.arguments[k]) for k in g.arguments):
                used.add(i)
                correct += 1
                break
    return correct / len(gold)


def _repeats(calls: list[ToolCall]) -> int:
    """Calls equal to the call just before them (same name, equal argument objects)."""
    return sum(a.name == b.name and a.arguments == b.arguments for a, b in zip(calls, calls[1:]))


_INPUTS = ("should_no_call", "toolpo_correct_ratio", "rltr_comp", "rltr_repeat_penalty", "rltr_error_penalty", "rltr_format_valid")


def paper_inputs(task: Task, turns: list[Turn]) -> dict[str, float]:
    """Every per-rollout estimator input of one rollout, by name (each defined by the function of that
    name below); all NaN (reason logged) when the task cannot be scored.

    On the no-call path every input but ``should_no_call`` (1) is 0, as the baselines' rewards give.
    """
    try:
        b = _read(task, turns)
    except Unscorable as e:
        log.warning("paper estimator inputs are NaN: %s", e)
        return {k: math.nan for k in _INPUTS}
    if b.no_call:
        return {k: float(k == "should_no_call") for k in _INPUTS}
    repeats, errors = _repeats(b.calls), b.n_blocks - len(b.valid)
    return {
        "should_no_call": 0.0,
        "toolpo_correct_ratio": _toolpo_ratio(b.calls, b.gold_calls),
        "rltr_comp": _rule_comp(task, b.calls),
        "rltr_repeat_penalty": -RLTR_LAMBDA_REPEAT * repeats if repeats else 0.0,
        "rltr_error_penalty": -RLTR_MU_ERROR * errors if errors else 0.0,
        "rltr_format_valid": float(b.format_valid),
    }


def _rule_comp(task: Task, calls: list[ToolCall]) -> float:
    """RLTR's completeness, by rule: 1.0 when every gold step's calls were made, in step order (slca's in-domain
    Process is 1 on these calls; a task without gold: no call made), else 0.0. Completeness asks whether a
    call is missing, not whether it ran: a call the rollout made but that was never answered (the turn limit)
    counts as made."""
    return float(_process(calls, task) == 1.0)


def _column(trajectories: list[Trajectory], name: str) -> torch.Tensor:
    return torch.tensor([paper_inputs(t.task, t.turns)[name] for t in trajectories], dtype=torch.float32)


def should_no_call(trajectories: list[Trajectory]) -> torch.Tensor:
    """(B,) float32: 1.0 when the task's gold has calls and the rollout attempted none (no tool turn:
    no call and no blocking parse error in any turn), else 0.0 (their ``should_call_but_no_call``);
    NaN for a task that cannot be scored."""
    return _column(trajectories, "should_no_call")


def toolpo_correct_ratio(trajectories: list[Trajectory]) -> torch.Tensor:
    """(B,) float32 in [0, 1]: ToolPO's ``R_action = Σ_g C(a_t^call) / |G|`` over the calls of the valid blocks.

    ``C`` is a strict match, one to one: each gold call (gold order) takes the first unused call with
    the exact name whose arguments hold every gold key, each value :func:`loose_equal` to the gold
    one (a gold call without arguments: the name alone). 1.0 when gold has no call; 0.0 when the
    rollout made no (valid) call; NaN for a task that cannot be scored.
    """
    return _column(trajectories, "toolpo_correct_ratio")


def rltr_comp(trajectories: list[Trajectory]) -> torch.Tensor:
    """(B,) float32 in {0, 1}: RLTR's completeness ``R_comp``, by a rule stand-in.

    RLTR's ``R_comp = (1/N) Σ_j γ_j(τ)`` averages an LLM checker's 0/1 verdicts ("is a call
    missing?") over N samples. No checker is served in training, so this is 1.0 when slca's in-domain
    Process is 1 (:func:`~slca.rewards.in_domain_metrics`: every gold step's calls made in order; a
    task without gold: no call made), else 0.0; 0.0 on the no-call path; NaN when unscorable.
    """
    return _column(trajectories, "rltr_comp")


def rltr_repeat_penalty(trajectories: list[Trajectory]) -> torch.Tensor:
    """(B,) float32 <= 0: RLTR's ``R_repeat = -λ_repeat · #repeats`` (λ_repeat = :data:`RLTR_LAMBDA_REPEAT`),
    a repeat being a call (of a valid block) with the same name and equal argument object as the call
    just before it; 0.0 on the no-call path; NaN when unscorable."""
    return _column(trajectories, "rltr_repeat_penalty")


def rltr_error_penalty(trajectories: list[Trajectory]) -> torch.Tensor:
    """(B,) float32 <= 0: RLTR's ``R_error = -μ_error · #invalid blocks`` (μ_error = :data:`RLTR_MU_ERROR`;
    tool turns with a blocking parse error or a call to a tool not offered); 0.0 on the no-call path;
    NaN when unscorable."""
    return _column(trajectories, "rltr_error_penalty")


def rltr_format_valid(trajectories: list[Trajectory]) -> torch.Tensor:
    """(B,) float32 in {0, 1}: 1.0 when every tool turn is a valid block (also when there is none), else 0.0
    (RLTR scores an invalid trajectory -1 outright); 0.0 on the no-call path; NaN when unscorable."""
    return _column(trajectories, "rltr_format_valid")
