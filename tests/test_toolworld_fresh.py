"""toolworld's ``fresh`` split: the out-of-distribution set nobody chose on (issue 43, item 2).

Its entities and phrasings are new to toolworld (in no other split), no name is in the warm start's
synthetic-name pools, and the set is fixed: a change to it shows here as a changed fingerprint, which the
docs' OOD figures would no longer describe.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import asdict

import pytest

from slca.env import toolworld as tw

FRESH_FINGERPRINT = "96bf05b6a095d1d1"
"""sha256 of the fixed set (entities and templates), committed 2026-12-03 before anything was measured on it."""


def _words(ents) -> set[str]:
    return {w.lower() for e in ents.all() for w in e.split()}


def test_the_fresh_set_is_fixed():
    blob = json.dumps({"entities": asdict(tw.FRESH_ENTITIES), "templates": tw.FRESH_TEMPLATES}, sort_keys=True)
    assert hashlib.sha256(blob.encode()).hexdigest()[:16] == FRESH_FINGERPRINT, (
        "the fresh split changed: its figures in README.md, docs/warmstart.md and docs/demo.md no longer describe it")


def test_fresh_entities_are_in_no_other_split():
    fresh = _words(tw.FRESH_ENTITIES)
    for split in ("train", "test"):
        assert not fresh & _words(tw.entities(split)), split
    assert tw.entities("fresh") == tw.FRESH_ENTITIES


def test_no_fresh_name_is_in_the_warm_starts_name_pools():
    pytest.importorskip("faker")
    from recipes.warmstart.augment import faker_names

    caps, lower = faker_names()
    pool = {w.lower() for w in caps} | set(lower)
    assert not _words(tw.FRESH_ENTITIES) & pool


def _slots(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def test_fresh_phrasings_are_new_and_ask_for_the_same_slots():
    others = {t for tt in tw._TYPES for t in tt.templates}
    training_types = {tt.name: tt for tt in tw._TYPES if not tt.heldout}
    assert set(tw.FRESH_TEMPLATES) == set(training_types)
    for name, templates in tw.FRESH_TEMPLATES.items():
        assert len(templates) == 2 and not set(templates) & others, name
        assert all(_slots(t) == _slots(training_types[name].templates[0]) for t in templates), name
    assert tw.request_templates("fresh") == tw.FRESH_TEMPLATES


def test_fresh_tasks_use_only_fresh_entities_and_phrasings_and_their_gold_runs():
    tasks = tw.make_tasks("fresh")
    assert len(tasks) == 300 and tasks == tw.make_tasks("fresh")  # deterministic
    fresh_templates = {t for ts in tw.FRESH_TEMPLATES.values() for t in ts}
    fresh_entities = set(tw.FRESH_ENTITIES.all())
    names = {n for t in tw.TOOLS for n in [t["function"]["name"]]}
    assert {t.kind for t in tasks} == set(tw.KINDS)
    for t in tasks:
        assert t.meta["split"] == "fresh" and t.meta["template"] in fresh_templates
        assert "{" not in t.messages[0]["content"]
        assert {e for e in t.meta["entities"] if isinstance(e, str) and re.search("[A-Za-z]", e)} <= fresh_entities, t.meta
        assert {o["function"]["name"] for o in t.tools} <= names  # the training tools only
        tw.run_gold(t)
    requests = {t.messages[0]["content"] for t in tw.make_tasks("train", n=2000)}
    assert not requests & {t.messages[0]["content"] for t in tasks}


def test_fresh_is_an_evaluation_split_everywhere_one_is_taken():
    from slca.training.config import TrainConfig, validate

    assert validate(TrainConfig(eval_split="fresh", ood_splits=["test"])).eval_split == "fresh"
    assert validate(TrainConfig(ood_splits=["fresh", "test"])).ood_splits == ["fresh", "test"]


def test_the_quoted_fresh_figure_is_the_shipped_builds_record():
    """README.md and docs/warmstart.md quote PF3's tool-task success on fresh: the committed record's, of the shipped build."""
    from pathlib import Path

    from slca.models.named import model_fingerprint

    root = Path(__file__).resolve().parents[1]
    rep = json.loads((root / "docs" / "results" / "fresh" / "pf3" / "toolworld.json").read_text())
    assert rep["config"]["split"] == "fresh" and rep["config"]["temperature"] == 0.0
    assert rep["config"]["model_fingerprint"] == model_fingerprint("default")  # the shipped build, measured
    tool = [r["scores"]["success"] for r in rep["records"] if r["group"] in ("single", "parallel", "chain")]
    figure = f"{sum(tool) / len(tool):.3f}"
    assert len(tool) == 240 and figure == "0.300"
    for page in ("README.md", "docs/warmstart.md"):
        text = " ".join((root / page).read_text().split())
        assert f"{figure} of tool-needing tasks** on `fresh`" in text or f"**{figure}** (72 of 240)" in text, page
