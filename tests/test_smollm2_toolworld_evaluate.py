"""recipes/smollm2_toolworld/evaluate.py: the stage-1 evaluation's task sets (issue 42).

Each split is read from its first task until it holds 300 tool-needing tasks, so the tasks ``slca eval --split``
runs are its prefix and the recipe's figures extend slca's own evaluations. The evaluation runs themselves
(SmolLM2, BFCL) are part of ``scripts/build_smollm2_toolworld.sh``, not a test.
"""

from __future__ import annotations

from recipes.smollm2_toolworld import split_tasks
from slca.env import toolworld


def test_evaluation_sets_hold_300_tool_tasks_and_extend_slca_evals():
    for split in ("test", "heldout_tools"):
        tasks = split_tasks(split, 300)
        tool = [t for t in tasks if t.kind in ("single", "parallel", "chain")]
        assert len(tool) == 300 and tasks[-1].kind in ("single", "parallel", "chain")
        default = toolworld.make_tasks(split, seed=0)  # what `slca eval --split` runs
        n = min(len(default), len(tasks))
        assert [t.id for t in tasks[:n]] == [t.id for t in default[:n]]
