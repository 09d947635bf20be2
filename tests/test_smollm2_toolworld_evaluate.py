"""recipes/smollm2_toolworld/evaluate.py: the stage-1 evaluation's task sets (issue 42).

Each split is read from its first task until it holds 300 tool-needing tasks, so the tasks ``slca eval --split``
runs are its prefix and the recipe's figures extend slca's own evaluations. The evaluation runs themselves
(SmolLM2, BFCL) are part of ``scripts/build_smollm2_toolworld.sh``, not a test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from recipes.smollm2_toolworld import split_tasks
from recipes.smollm2_toolworld.evaluate import BFCL_CATEGORIES, summarize
from slca.env import toolworld


def test_evaluation_sets_hold_300_tool_tasks_and_extend_slca_evals():
    for split in ("test", "heldout_tools"):
        tasks = split_tasks(split, 300)
        tool = [t for t in tasks if t.kind in ("single", "parallel", "chain")]
        assert len(tool) == 300 and tasks[-1].kind in ("single", "parallel", "chain")
        default = toolworld.make_tasks(split, seed=0)  # what `slca eval --split` runs
        n = min(len(default), len(tasks))
        assert [t.id for t in tasks[:n]] == [t.id for t in default[:n]]


def _bfcl_report(folder, accuracy: float, fingerprint: str) -> None:
    """A minimal `slca eval --suite bfcl` report (the fields summarize reads) in ``folder``."""
    folder.mkdir(parents=True)
    groups = {c: {"accuracy": accuracy} for c in BFCL_CATEGORIES}
    (folder / "bfcl.json").write_text(json.dumps({"groups": groups, "counts": {c: 50 for c in BFCL_CATEGORIES},
                                                  "config": {"model_fingerprint": fingerprint}}))


def test_summary_reads_bfcl_from_slca_eval_reports_and_names_where_each_came_from(tmp_path):
    results = tmp_path / "smollm2_toolworld"
    results.mkdir()
    assert "| simple_python | - | - |" in summarize(results)  # nothing measured: no figure is made up
    assert "Before: not measured. After: not measured." in summarize(results)
    _bfcl_report(results / "before" / "bfcl", 0.0, "smollm2:fp-before")
    _bfcl_report(tmp_path / "study42" / "sft" / "bfcl", 0.34, "smollm2-toolworld:fp-after")  # study 42's start
    text = summarize(results)
    assert "| simple_python | 0.000 (50) | 0.340 (50) |" in text
    assert "`slca eval` in `before/bfcl` (`smollm2:fp-before`)" in text
    assert "`slca eval` in `../study42/sft/bfcl` (`smollm2-toolworld:fp-after`)" in text
    _bfcl_report(results / "after" / "bfcl", 0.5, "smollm2-toolworld:fp-own")  # the recipe's folder comes first
    assert "| simple_python | 0.000 (50) | 0.500 (50) |" in summarize(results)


def test_the_committed_stage1_summary_is_what_the_committed_records_make(tmp_path):
    """docs/results/smollm2_toolworld/summary.md is written from the records beside it (and study 42's start): a
    record added or changed without rerunning ``summary`` leaves the page stale, and this fails."""
    docs = Path(__file__).resolve().parents[1] / "docs" / "results"
    copy = tmp_path / "smollm2_toolworld"
    shutil.copytree(docs / "smollm2_toolworld", copy, ignore=shutil.ignore_patterns(".slca-partial", "*.log"))
    shutil.copytree(docs / "study42" / "sft" / "bfcl", tmp_path / "study42" / "sft" / "bfcl")
    assert summarize(copy) == (docs / "smollm2_toolworld" / "summary.md").read_text()
