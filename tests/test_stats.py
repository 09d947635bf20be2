"""The step statistics that say how often a rollout lacks a segment (issue 26, item 9)."""

from __future__ import annotations

import math

import torch

from slca.training.stats import RolloutStats, mixed_fraction


def test_mixed_fraction_counts_groups_that_disagree():
    flags = torch.tensor([True, True, False, False, True, False])
    assert mixed_fraction([0, 0, 1, 1, 2, 2], flags) == 1 / 3  # only group 2 mixes callers and non-callers
    assert mixed_fraction(["a", "b", "a", "b"], torch.tensor([True, True, False, True])) == 0.5  # groups need not be contiguous
    assert math.isnan(mixed_fraction([], torch.zeros(0, dtype=torch.bool)))


def test_rollout_stats_log_missing_segments_as_shares():
    rs = RolloutStats(4, 40, 20, [0, 1, 2, 1], ["final_answer"] * 3 + ["max_turns"], 10.0,
                      no_tool_segment=1, no_summary_segment=1, mixed_call_groups=0.5)
    m = rs.metrics()
    assert m["rollout/no_tool_segment"] == 0.25 and m["rollout/no_summary_segment"] == 0.25
    assert m["rollout/mixed_call_groups"] == 0.5 and m["rollout/stop_max_turns"] == 0.25
