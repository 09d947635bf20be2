"""BFCL (Berkeley Function-Calling Leaderboard) through the ``bfcl-eval`` package.

Prompts and ground truth come from the data the ``bfcl-eval`` wheel ships
(``bfcl_eval.utils.load_dataset_entry`` / ``load_ground_truth_entry``, with
BFCL's own language hint in the function docs, as its generation step loads
them). The policy sees the function docs as tools in its chat template (BFCL's
"FC" mode for local models, as its ``QwenFCHandler`` does), and its calls are
scored by BFCL's own checkers:

* single-turn AST categories (``simple_python``, ``simple_java``,
  ``simple_javascript``, ``multiple``, ``parallel``, ``parallel_multiple``,
  ``live_*``): ``ast_checker`` on the decoded calls ``[{name: {arg: value}}]``,
  in the category's language, against the function docs as BFCL's checker
  loads them (without the language hint; for Java and JavaScript the policy
  sees every parameter as a string holding a Java / JavaScript literal, and the
  checker converts it back with BFCL's type converters);
* ``irrelevance`` / ``live_irrelevance``: correct when the turn has no call;
  ``live_relevance``: correct when it has one (BFCL's relevance runner);
* ``multi_turn_base``, ``multi_turn_miss_func``, ``multi_turn_miss_param``,
  ``multi_turn_long_context``: the multi-turn loop of BFCL's handlers (each
  user turn, up to 20 steps while the model keeps calling), calls executed on
  BFCL's Python API simulators (with ``long_context=True`` for
  ``long_context``, as BFCL does), then ``multi_turn_checker`` (state and
  response checks against the ground-truth execution). In ``miss_func`` the
  held-out functions join the tools at their turn, whose user message is
  BFCL's "I have updated some more functions you can choose from. What about
  now?" (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``).

BFCL caches simulator instances in a module global keyed by model name and
entry id, so every rollout here uses its own model name (distinct instance
names), and the instances are dropped after scoring.

Install: ``pip install --no-deps bfcl-eval==2026.3.23`` plus ``filelock
mpmath``; :func:`import_bfcl` stands a small module in for
``bfcl_eval.constants.model_config`` (the real one imports every API client
BFCL supports; the checker reads one flag from it) and points
``BFCL_PROJECT_ROOT`` at a writable cache folder.
"""

from __future__ import annotations

import copy
import functools
import os
import pathlib
import re
import sys
import types
import uuid
from dataclasses import dataclass
from typing import Any

from slca.eval.agent import AgentTurn, PolicyAgent, drive
from slca.eval.report import PartialRecords, Record, SuiteReport, group_means, mean, truncation
from slca.types import ToolCall

__all__ = [
    "AST_CATEGORIES",
    "SIMPLE_CATEGORIES",
    "MULTI_TURN_CATEGORIES",
    "language_of",
    "CATEGORIES",
    "resolve_categories",
    "import_bfcl",
    "load_category",
    "score_single_turn",
    "to_execution_strings",
    "BFCLSingleTurnEpisode",
    "BFCLMultiTurnEpisode",
    "run_bfcl",
]

AST_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
)
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
CATEGORIES = AST_CATEGORIES + MULTI_TURN_CATEGORIES
SIMPLE_CATEGORIES = ("simple_python", "simple_java", "simple_javascript")
# groups as bfcl_eval.constants.category_mapping.TEST_COLLECTION_MAPPING has them (the categories slca runs)
_GROUPS = {
    "simple": SIMPLE_CATEGORIES,
    "non_live": SIMPLE_CATEGORIES + ("multiple", "parallel", "parallel_multiple", "irrelevance"),
    "non_python": ("simple_java", "simple_javascript"),
    "python": tuple(c for c in AST_CATEGORIES if c not in ("simple_java", "simple_javascript")),
    "live": tuple(c for c in AST_CATEGORIES if c.startswith("live_")),
    "single_turn": AST_CATEGORIES,
    "multi_turn": MULTI_TURN_CATEGORIES,
    "all": CATEGORIES,
}
MODEL_NAME = "slca-policy"
MAX_STEPS_PER_TURN = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT


def resolve_categories(names: list[str] | None) -> list[str]:
    """Category names and group names (simple, non_live, non_python, python, live, single_turn, multi_turn, all) -> categories."""
    if not names:
        return list(_GROUPS["non_live"])
    out: list[str] = []
    for n in names:
        cats = _GROUPS.get(n, (n,) if n in CATEGORIES else None)
        if cats is None:
            raise ValueError(f"unknown BFCL category {n!r}; choose from {list(CATEGORIES)} or groups {list(_GROUPS)}")
        out += [c for c in cats if c not in out]
    return out


@dataclass
class _ModelConfig:
    """What the AST checker reads from BFCL's model registry."""

    underscore_to_dot: bool = False


class _AnyModel(dict):
    """BFCL's MODEL_CONFIG_MAPPING stand-in: every model name maps to one config."""

    def __missing__(self, key: str) -> _ModelConfig:
        return _ModelConfig()


@functools.lru_cache(maxsize=1)
def import_bfcl() -> types.SimpleNamespace:
    """Import the parts of ``bfcl_eval`` the checkers need, without its API clients.

    Sets ``BFCL_PROJECT_ROOT`` (if unset) to ``$SLCA_CACHE/bfcl`` or
    ``~/.cache/slca/bfcl`` (BFCL creates result/score folders there at import)
    and, unless the real ``bfcl_eval.constants.model_config`` is already
    imported, registers a stand-in module for it whose mapping gives every model
    ``underscore_to_dot=False`` (function names keep their dots, as the tools
    the policy sees do).
    """
    root = pathlib.Path(os.environ.get("SLCA_CACHE", pathlib.Path.home() / ".cache" / "slca")) / "bfcl"
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(root))
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        mapping = sys.modules[name].MODEL_CONFIG_MAPPING
        if MODEL_NAME.replace("_", "/") not in mapping and not isinstance(mapping, _AnyModel):
            raise ValueError("the real bfcl_eval model_config is imported; slca's BFCL runner needs its stand-in (import slca.eval.bfcl first)")
    else:
        import bfcl_eval.constants  # noqa: F401  (the parent package must exist first)

        stub = types.ModuleType(name)
        stub.MODEL_CONFIG_MAPPING = _AnyModel()  # type: ignore[attr-defined]
        sys.modules[name] = stub
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output, load_dataset_entry, load_ground_truth_entry

    return types.SimpleNamespace(
        Language=Language,
        added_functions_prompt=DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
        ast_checker=ast_checker,
        multi_turn_checker=multi_turn_checker,
        multi_turn_utils=multi_turn_utils,
        execute=multi_turn_utils.execute_multi_turn_func_call,
        is_empty_output=is_empty_output,
        is_function_calling_format_output=is_function_calling_format_output,
        load_dataset_entry=load_dataset_entry,
        load_ground_truth_entry=load_ground_truth_entry,
    )


def language_of(category: str) -> str:
    """``JAVA``, ``JAVASCRIPT`` or ``PYTHON``: the :class:`bfcl_eval.constants.enums.Language` a category is checked in (``is_java`` / ``is_js`` in bfcl_eval)."""
    return {"simple_java": "JAVA", "simple_javascript": "JAVASCRIPT"}.get(category, "PYTHON")


def load_category(category: str, limit: int | None = None) -> list[tuple[dict[str, Any], Any]]:
    """``(entry, ground_truth)`` pairs of one category, in BFCL's order; ground truth None where BFCL has none.

    Single-turn entries also carry ``checker_function``: the function docs as
    BFCL's checker loads them (no language hint, Java / JavaScript types kept).
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose from {list(CATEGORIES)}")
    b = import_bfcl()
    entries = b.load_dataset_entry(category)
    if category in AST_CATEGORIES:
        raw = b.load_dataset_entry(category, include_language_specific_hint=False)
        for e, r in zip(entries, raw, strict=True):
            e["checker_function"] = r["function"]
    if "irrelevance" in category or "relevance" in category:
        gts: list[Any] = [None] * len(entries)
    else:
        gt_rows = b.load_ground_truth_entry(category)
        if len(gt_rows) != len(entries):
            raise ValueError(f"BFCL {category}: {len(entries)} prompts but {len(gt_rows)} ground-truth rows")
        gts = [g["ground_truth"] for g in gt_rows]
    pairs = list(zip(entries, gts))
    return pairs[:limit] if limit is not None else pairs


def tools_of(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The entry's function docs as OpenAI tool schemas (BFCL's ``dict`` types left as BFCL writes them)."""
    return [{"type": "function", "function": f} for f in entry["function"]]


def score_single_turn(entry: dict[str, Any], ground_truth: Any, category: str, calls: list[ToolCall] | None) -> tuple[bool, str | None]:
    """Score one single-turn answer with BFCL's own rules.

    Args:
        entry: the BFCL prompt entry (its ``function`` docs are used).
        ground_truth: the possible answers (None for relevance categories).
        category: the BFCL category.
        calls: the decoded calls; None when the output could not be decoded.

    Returns:
        ``(valid, error)``: BFCL's verdict and its error text when invalid.
    """
    b = import_bfcl()
    decoded = [{c.name: dict(c.arguments)} for c in calls] if calls is not None else None
    if "relevance" in category or "irrelevance" in category:
        has_call = decoded is not None and not b.is_empty_output(decoded)
        ok = (not has_call) if "irrelevance" in category else has_call
        return ok, None if ok else ("function call where none was due" if has_call else "no function call")
    if not decoded:
        return False, "ast_decoder:decoder_failed (no decodable call)"
    if not b.is_function_calling_format_output(decoded):
        return False, "ast_decoder:decoder_wrong_output_format"
    docs = entry.get("checker_function", entry["function"])
    res = b.ast_checker(docs, decoded, ground_truth, getattr(b.Language, language_of(category)), category, MODEL_NAME)
    return bool(res["valid"]), None if res["valid"] else f"{res.get('error_type')}: {res.get('error')}"


def to_execution_strings(calls: list[ToolCall]) -> list[str]:
    """Calls as BFCL execution strings ``name(k=repr(v),...)`` (``convert_to_function_call`` in bfcl_eval)."""
    return [f"{c.name}({','.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in calls]


class BFCLSingleTurnEpisode:
    """One rollout of a single-turn BFCL entry: one assistant turn, scored by the AST rules."""

    def __init__(self, entry: dict[str, Any], ground_truth: Any, category: str, sample: int):
        self.entry, self.ground_truth, self.category, self.sample = entry, ground_truth, category, sample
        self.messages = copy.deepcopy(entry["question"][0])
        self.tools = tools_of(entry)
        self.done = False
        self.turn: AgentTurn | None = None

    def conversation(self):
        return self.messages, self.tools

    def step(self, turn: AgentTurn) -> None:
        self.turn = turn
        self.done = True

    def record(self) -> Record:
        assert self.turn is not None
        p = self.turn.parsed
        calls = p.calls if (p.calls or not p.errors) else None
        ok, err = score_single_turn(self.entry, self.ground_truth, self.category, calls)
        return Record(self.entry["id"], self.category, self.sample, {"accuracy": float(ok)}, err, {"output": self.turn.text, "truncated_turns": int(self.turn.truncated)})


class BFCLMultiTurnEpisode:
    """One rollout of a multi-turn BFCL entry, executed on BFCL's API simulators.

    Mirrors ``BaseHandler.inference_multi_turn_FC``: for each user turn, the
    model keeps stepping while it emits decodable calls (each step's calls run
    on the simulators and come back as tool messages); a turn without calls
    ends the user turn; a 21st step with calls in one turn force-terminates the
    entry (scored wrong, as in BFCL). A ``miss_func`` entry's held-out
    functions (``missed_function``: turn -> function docs) join the tools at
    their turn, which BFCL leaves without a user message and fills with its
    "I have updated some more functions" prompt.
    """

    def __init__(self, entry: dict[str, Any], ground_truth: list[list[str]], sample: int, run_tag: str):
        self.entry, self.ground_truth, self.sample = entry, ground_truth, sample
        self.category = entry["id"].rsplit("_", 1)[0]
        self.model_name = f"slca_{run_tag}_s{sample}"  # distinct simulator instances per rollout
        self.tools = tools_of(entry)
        self.held_out: dict[int, list[dict[str, Any]]] = {int(k): list(v) for k, v in (entry.get("missed_function") or {}).items()}
        self.questions = copy.deepcopy(entry["question"])
        for k in self.held_out:
            if k >= len(self.questions) or self.questions[k]:
                raise ValueError(f"BFCL entry {entry['id']}: held-out functions at turn {k}, which must exist and have no user message")
            self.questions[k] = [{"role": "user", "content": import_bfcl().added_functions_prompt}]
        self._add_held_out(0)
        self.messages: list[dict[str, Any]] = list(self.questions[0])
        self.turn_idx = 0
        self.steps_in_turn = 0
        self.decoded: list[list[list[str]]] = [[]]
        self.force_quit = False
        self.done = False
        self.truncated_turns = 0  # turns whose prompt was cut to the policy's positions
        self._exec([])

    def _exec(self, calls: list[str]) -> list[str]:
        b = import_bfcl()
        results, _ = b.execute(
            calls,
            self.entry.get("initial_config", {}),
            self.entry["involved_classes"],
            self.model_name,
            self.entry["id"],
            long_context="long_context" in self.category,
            is_evaL_run=False,
        )
        return results

    def conversation(self):
        return self.messages, self.tools

    def step(self, turn: AgentTurn) -> None:
        self.truncated_turns += turn.truncated
        self.messages.append({"role": "assistant", "content": turn.text})
        calls = turn.parsed.calls
        if calls:
            strs = to_execution_strings(calls)
            self.decoded[-1].append(strs)
            for c, res in zip(calls, self._exec(strs)):
                self.messages.append({"role": "tool", "name": c.name, "content": res})
            self.steps_in_turn += 1
            if self.steps_in_turn > MAX_STEPS_PER_TURN:  # BFCL: `count > MAXIMUM_STEP_LIMIT` after the step
                self.force_quit = True
                self.done = True
            return
        self.turn_idx += 1
        self.steps_in_turn = 0
        if self.turn_idx >= len(self.questions):
            self.done = True
            return
        self.decoded.append([])
        self._add_held_out(self.turn_idx)
        self.messages.extend(self.questions[self.turn_idx])

    def _add_held_out(self, turn: int) -> None:
        """From ``turn`` on, the functions BFCL held out until then are on offer too."""
        self.tools = self.tools + tools_of({"function": self.held_out.get(turn, [])})

    def record(self) -> Record:
        b = import_bfcl()
        try:
            if self.force_quit or len(self.decoded) != len(self.ground_truth):
                ok, err = False, "multi_turn:force_terminated"
            else:
                res = b.multi_turn_checker(self.decoded, self.ground_truth, self.entry, self.category, self.model_name)
                ok = bool(res["valid"])
                err = None if ok else f"{res.get('error_type')}: {res.get('error_message')}"
        finally:
            self.release()
        return Record(self.entry["id"], self.category, self.sample, {"accuracy": float(ok)}, err, {"calls": self.decoded, "truncated_turns": self.truncated_turns})

    def release(self) -> None:
        """Drop this rollout's simulator instances from BFCL's module-global cache."""
        g = import_bfcl().multi_turn_utils.__dict__
        prefix = re.sub(r"[-./:]", "_", self.model_name)
        for k in [k for k in g if k.startswith(prefix)]:
            del g[k]


def summarize(records: list[Record], categories: list[str]) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, int]]:
    """BFCL-style numbers: accuracy per category, then the leaderboard's group summaries.

    ``simple_ast``: unweighted mean over simple_python, simple_java,
    simple_javascript (those evaluated); ``non_live_ast``: unweighted mean of
    simple_ast, multiple, parallel, parallel_multiple (those evaluated), as
    bfcl_eval's ``eval_runner_helper`` computes them; ``live_ast``: accuracy over all live
    AST entries together (BFCL weights live categories by size); ``multi_turn``:
    unweighted mean over multi-turn categories; ``relevance`` /
    ``irrelevance``: as evaluated; ``overall``: unweighted mean of the categories run.
    """
    groups, counts = group_means(records, ["accuracy"])
    acc = {c: groups[c]["accuracy"] for c in categories if c in groups}
    metrics: dict[str, float] = {}
    simple = [acc[c] for c in SIMPLE_CATEGORIES if c in acc]
    if simple:
        metrics["simple_ast"] = mean(simple)
    nl = ([metrics["simple_ast"]] if simple else []) + [acc[c] for c in ("multiple", "parallel", "parallel_multiple") if c in acc]
    if nl:
        metrics["non_live_ast"] = mean(nl)
    live = [r.scores["accuracy"] for r in records if r.group in ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")]
    if live:
        metrics["live_ast"] = mean(live)
    mt = [acc[c] for c in MULTI_TURN_CATEGORIES if c in acc]
    if mt:
        metrics["multi_turn"] = mean(mt)
    irr = [r.scores["accuracy"] for r in records if r.group in ("irrelevance", "live_irrelevance")]
    if irr:
        metrics["irrelevance"] = mean(irr)
    if "live_relevance" in acc:
        metrics["relevance"] = acc["live_relevance"]
    metrics["overall"] = mean(acc.values())
    return metrics, groups, counts


def run_bfcl(agent: PolicyAgent, categories: list[str] | None = None, *, limit: int | None = None, samples: int = 1, progress: bool = True, model_label: str = "",
             partial: PartialRecords | None = None) -> SuiteReport:
    """Evaluate the agent on BFCL categories; accuracy per category as BFCL reports it.

    ``partial``: each category's records are saved there as it finishes, and a category saved there by an earlier,
    stopped evaluation under the same key is read back instead of run again (``slca eval --out``, greedy).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    cats = resolve_categories(categories)
    tag = uuid.uuid4().hex[:8]
    records: list[Record] = []
    for cat in cats:
        saved = partial.load(cat) if partial is not None else None
        if saved is not None:
            records += saved[0]
            agent.generated_tokens += saved[1]
            continue
        pairs = load_category(cat, limit)
        if cat in MULTI_TURN_CATEGORIES:
            eps: list[Any] = [BFCLMultiTurnEpisode(e, g, s, tag) for e, g in pairs for s in range(samples)]
        else:
            eps = [BFCLSingleTurnEpisode(e, g, cat, s) for e, g in pairs for s in range(samples)]
        before = agent.generated_tokens
        drive(agent, eps, desc=f"bfcl {cat}", progress=progress)
        done = [e.record() for e in eps]
        records += done
        if partial is not None:
            partial.save(cat, done, agent.generated_tokens - before)
    metrics, groups, counts = summarize(records, cats)
    metrics["truncated_records"], cut = truncation(records, agent.prompt_limit())
    notes = ["accuracy = share of rollouts BFCL's checker accepts (AST checker; multi_turn_checker for multi_turn_*)", *cut]
    if partial is not None and partial.resumed:
        notes.append(f"resumed: {', '.join(partial.resumed)} read back from {partial.folder} (an earlier run of this evaluation, "
                     "same model and settings, stopped before its report)")
    return SuiteReport(
        suite="bfcl",
        model=model_label,
        metrics=metrics,
        groups=groups,
        counts=counts,
        samples=samples,
        records=records,
        config={"categories": cats, "limit": limit, "format": agent.format_name},
        notes=notes,
    )
