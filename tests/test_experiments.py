"""slca.training.experiments: the runs of a comparison reused, resumed or refused by their stored config and model
fingerprint (the processes themselves: test_compare.py, test_cli.py and test_unattended.py run real comparisons)."""

from __future__ import annotations

import os

import pytest
from test_runs import _save

from slca.training.config import TrainConfig, validate
from slca.training.experiments import RunSpec, check_runs, run_status
from slca.training.runs import RunFolder


# ---------------------------------------------------------------- compare reuses only runs of the same config


def test_compare_reuses_only_matching_runs(tmp_path):
    from slca.models.named import model_fingerprint
    from slca.training.runs import write_model_record

    out = tmp_path / "cmp"
    sets = ["steps=2", "tasks_per_step=2"]
    sp = RunSpec("grpo", 0, out / "grpo-seed0")
    assert run_status(sp, sets) == ("new", [])
    cfg = validate(TrainConfig(run_dir=str(sp.run_dir), estimator="grpo", seed=0, steps=2, tasks_per_step=2))
    with RunFolder(cfg):
        pass
    write_model_record(sp.run_dir, "default", model_fingerprint("default"))
    _save(sp.run_dir / "checkpoints", 1)
    assert run_status(sp, sets) == ("resume", [])  # interrupted: continued with --resume
    _save(sp.run_dir / "checkpoints", 2)
    (sp.run_dir / "samples.json").write_text("[]")
    assert run_status(sp, sets) == ("done", [])
    write_model_record(sp.run_dir, "default", "default:another-build")  # records of another build are not reused
    assert run_status(sp, sets)[0] == "differs" and "model fingerprint" in run_status(sp, sets)[1][0]
    write_model_record(sp.run_dir, "default", model_fingerprint("default"))
    assert run_status(sp, [*sets[:1], "tasks_per_step=2", "steps=3"]) == ("resume", [])  # more steps: extended
    status, diff = run_status(sp, [*sets, "lr=0.001"])
    assert status == "differs" and diff == ["lr: 0.0002 -> 0.001"]
    with pytest.raises(ValueError, match=r"--out: 1 run folder\(s\) in .* were trained with another config: grpo-seed0 \(lr: 0.0002 -> 0.001\)"):
        check_runs(["grpo"], [0], out, [*sets, "lr=0.001"])
    assert check_runs(["grpo"], [0], out, [*sets, "lr=0.001"], overwrite=True).lr == 0.001
    os.remove(sp.run_dir / "config.json")
    (sp.run_dir / "config.json").write_text("{not json")
    assert run_status(sp, sets)[0] == "differs"
