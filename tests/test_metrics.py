"""The metric vocabulary (slca.metrics): every key a run logs is declared once, and the outputs select from it."""

from __future__ import annotations

import math

import pytest
import torch

from slca import metrics as M
from slca.rewards.batch import RewardComponents
from slca.training.stats import CreditStats, GradSplit, RewardStats, RolloutStats, UpdateStats, step_metrics


def _row() -> dict:
    comps = RewardComponents()
    comps.execution["success"] = [1.0, 0.0]
    comps.summary["concision"] = [0.5, 1.0]
    return step_metrics(
        3,
        RolloutStats(2, 10, 8, [1, 2], ["final_answer", "max_turns"], 50.0),
        RewardStats(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 1.0]), comps, turn=torch.ones(2, 2)),
        CreditStats({"mean": 0.0, "std": 1.0, "abs_mean": 1.0}, {"mean": 0.0, "std": 1.0, "abs_mean": 1.0}, 0.1, 0.5),
        UpdateStats([1.0], [0.1], [0.01], [2.0], GradSplit(1.0, 1.0, 0.2)),
        volatility=0.3, lr=1e-5, train_tokens_per_s=9.0)


def test_every_key_of_a_training_row_is_declared_and_in_its_range():
    row = _row()
    for k, v in row.items():
        lo, hi = M.metric_range(k)
        assert lo <= v <= hi, k
    assert {"reward/exec/success", "reward/summary/concision", "rollout/stop_max_turns", "adv/tool_abs_mean"} <= set(row)


@pytest.mark.parametrize("key,name", [
    ("eval_test/tool_tasks/success", "{set}/tool_tasks/success"), ("eval/kind/chain/reward_summary", "{set}/kind/{kind}/reward_summary"),
    ("reward/summary", "reward/summary"), ("reward/summary/completeness", "reward/summary/{component}"),
    ("auc/eval/tool_tasks/success", "auc/{set}/tool_tasks/success"), ("adv/summary_abs_mean", "adv/{segment}_{stat}"),
])
def test_lookup_finds_the_one_declaration(key, name):
    assert M.lookup(key).name == name


def test_an_undeclared_key_and_a_bad_slot_are_refused():
    with pytest.raises(ValueError, match="'reward/tools' is declared nowhere"):
        M.lookup("reward/tools")
    with pytest.raises(ValueError, match="has slots"):
        M.EVAL_SUCCESS.key(kind="x")
    with pytest.raises(ValueError, match="is not a key of metric"):
        M.ADV_STAT.key(segment="env", stat="mean")


def test_views_select_declared_metrics_and_ranges_bound_bands():
    for p in (*M.RUN_PLOTS, *M.COMPARE_PANELS):
        assert p.title and M.lookup(p.key)
    for k in (*M.COMPARE_SUMMARY, *M.COMPARE_DIAGNOSTICS):
        M.lookup(k)
    assert M.metric_range("grad/cosine_tool_summary") == (-1.0, 1.0)
    assert M.metric_range("probe/parallel_pref") == (-math.inf, math.inf)
    assert M.eval_sets_of(["eval_test/success", "reward/tool", "eval/success"]) == ["eval", "eval_test"]
    assert len({m.name for m in M.VOCABULARY}) == len(M.VOCABULARY)


def test_the_ood_panel_follows_the_split_the_runs_logged():
    """The demo evaluates toolworld's ``fresh`` split, not ``test``: its curves' OOD panel draws ``eval_fresh``
    (it was drawn empty); runs that logged ``eval_test`` keep it; runs with no OOD split keep the panel as is."""
    from slca.metrics import COMPARE_PANELS, RUN_PLOTS, with_logged_ood_split

    test_key, fresh_key = "eval_test/tool_tasks/success", "eval_fresh/tool_tasks/success"
    for panels in (RUN_PLOTS, COMPARE_PANELS):
        assert [p.key for p in panels].count(test_key) == 1
        fresh = with_logged_ood_split(panels, {"eval/tool_tasks/success", fresh_key, "eval_fresh/success"})
        assert fresh_key in [p.key for p in fresh] and test_key not in [p.key for p in fresh]
        assert "fresh split" in next(p.title for p in fresh if p.key == fresh_key)
        assert len(fresh) == len(panels)
        assert with_logged_ood_split(panels, {test_key, fresh_key}) == list(panels)
        assert with_logged_ood_split(panels, {"eval/tool_tasks/success"}) == list(panels)


def test_every_metric_name_the_scripts_spell_is_declared():
    """The study scripts read records by metric name; every name they spell (a string literal of a metric family:
    eval*/, reward/, adv/, grad/, rollout/, probe/, ppo/, perf/, auc/) must be one slca.metrics declares, so a
    renamed metric breaks this test, not a study table."""
    import ast
    import re
    from pathlib import Path

    from slca.metrics import lookup

    family = re.compile(r"^(eval[a-z_]*|reward|adv|grad|rollout|probe|ppo|perf|auc)/[a-z0-9_/]+$")
    bad, seen = [], 0
    for path in sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and family.match(node.value):
                seen += 1
                try:
                    lookup(node.value)
                except ValueError as e:
                    bad.append(f"{path.name}:{node.lineno}: {e}")
    assert seen > 20 and not bad, bad
