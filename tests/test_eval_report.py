"""slca.eval.report: pass^k, group means, JSON / markdown output."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slca.eval.report import Record, SuiteReport, group_means, pass_hat_k, successes_by_id


def test_pass_hat_k_hand_cases():
    # task a: 2 of 4 trials succeed; task b: 4 of 4.
    s = {"a": [True, False, True, False], "b": [True] * 4}
    assert pass_hat_k(s, 1) == pytest.approx((0.5 + 1.0) / 2)
    assert pass_hat_k(s, 2) == pytest.approx((1 / 6 + 1.0) / 2)  # C(2,2)/C(4,2) = 1/6
    assert pass_hat_k(s, 3) == pytest.approx((0.0 + 1.0) / 2)
    assert pass_hat_k(s, 4) == pytest.approx(0.5)


def test_pass_hat_k_matches_tau2():
    am = pytest.importorskip("tau2.metrics.agent_metrics")
    for n in range(1, 6):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_hat_k({"t": [True] * c + [False] * (n - c)}, k) == pytest.approx(am.pass_hat_k(n, c, k))


def test_pass_hat_k_bad_arguments():
    with pytest.raises(ValueError, match="k must be"):
        pass_hat_k({"a": [True]}, 0)
    with pytest.raises(ValueError, match="fewer than k"):
        pass_hat_k({"a": [True]}, 2)
    assert math.isnan(pass_hat_k({}, 1))


@given(st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=6))
def test_pass_hat_k_properties(trials):
    s = {str(i): t for i, t in enumerate(trials)}
    vals = [pass_hat_k(s, k) for k in (1, 2, 3)]
    assert vals[0] == pytest.approx(sum(sum(t) / 3 for t in trials) / len(trials))  # pass^1 = mean success rate
    assert vals[0] + 1e-12 >= vals[1] >= vals[2] - 1e-12  # non-increasing in k
    assert all(0 <= v <= 1 for v in vals)


def test_group_means_successes_and_save(tmp_path):
    recs = [
        Record("t1", "single", 0, {"success": 1.0, "name_f1": 1.0}),
        Record("t1", "single", 1, {"success": 0.0, "name_f1": 0.5}),
        Record("t2", "chain", 0, {"success": float("nan"), "name_f1": 0.0}),
    ]
    groups, counts = group_means(recs, ["success", "name_f1"])
    assert groups["single"] == {"success": 0.5, "name_f1": 0.75}
    assert math.isnan(groups["chain"]["success"])  # NaN (unscorable) rollouts are left out of means
    assert counts == {"chain": 1, "single": 1}
    assert successes_by_id(recs, "success") == {"t1": [True, False], "t2": [False]}
    rep = SuiteReport("toolworld", "m", {"success": 0.5}, groups, counts, 2, recs)
    jp, mp = rep.save(tmp_path)
    d = json.loads(jp.read_text())
    assert d["metrics"] == {"success": 0.5} and len(d["records"]) == 3
    md = mp.read_text()
    assert "| success | 0.5000 |" in md and "| single | 1 |" in md
