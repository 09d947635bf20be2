"""Run folders and checkpoints: atomic writes, intact-checkpoint resume, no pickle,
torn JSONL tails, resume / overwrite rules, compare's run reuse."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from slca.cli import app
from slca.training.config import ConfigError, TrainConfig, to_dict, validate
from slca.training.experiments import RunSpec, run_status
from slca.training.runs import (
    RunFolder, decode_state, encode_state, list_checkpoints, load_checkpoint, newest_intact_checkpoint, read_jsonl, rng_state,
    save_checkpoint, set_rng_state, verify_checkpoint,
)


class _Weights(torch.nn.Module):
    """A stand-in for a policy: save_pretrained writes safetensors like a transformers model."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))

    def save_pretrained(self, d, safe_serialization=True):
        from safetensors.torch import save_file

        save_file({"w": self.w.detach().clone()}, str(d / "model.safetensors"))


def _save(root, step, keep=2, state=None):
    return save_checkpoint(root, step, model=_Weights(), tokenizer=None, state=state or {"step": step}, keep=keep)


# ---------------------------------------------------------------- state without pickle


def test_state_round_trips_through_json_and_safetensors(tmp_path):
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.grad = torch.randn(4, 3)
    opt.step()
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    state = {"optimizer": opt.state_dict(), "rng": rng_state(), "grad_norms": [1.5, float("nan")], "samples": [{"a": [1, 2]}], "ref": None}
    meta, tensors = encode_state(state)
    json.dumps(meta)  # the rest is plain JSON
    d = _save(tmp_path / "ck", 1, state=state)
    _, back = load_checkpoint(d)
    assert back["optimizer"]["state"].keys() == opt.state_dict()["state"].keys()  # int keys stay int
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(back["optimizer"]["state"][0][k], v)
    assert back["optimizer"]["param_groups"][0]["betas"] == opt.state_dict()["param_groups"][0]["betas"]
    opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4, 3))], lr=1e-3)
    opt2.load_state_dict(back["optimizer"])
    # RNG states: the next random numbers are the same after a restore
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(back["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect
    assert back["grad_norms"][0] == 1.5 and np.isnan(back["grad_norms"][1])
    # nothing in a checkpoint needs pickle: the tensor files load with torch's weights_only loader's rules (safetensors)
    assert not [f for f in d.iterdir() if f.suffix in (".pt", ".pkl", ".bin")]


def test_encode_refuses_objects_it_cannot_store():
    with pytest.raises(TypeError, match="cannot store a object"):
        encode_state({"x": object()})
    assert decode_state(*encode_state({(1, 2): "t", "n": np.int64(3)})) == {(1, 2): "t", "n": 3}


# ---------------------------------------------------------------- checkpoints


def test_rotation_keeps_the_newest_by_step_number(tmp_path):
    root = tmp_path / "ck"
    for s in (1, 2, 3, 1000000):
        _save(root, s, keep=2)
    assert [s for s, _ in list_checkpoints(root)] == [3, 1000000]  # by number, not by name
    for s in (1, 2, 3):
        _save(tmp_path / "all", s, keep=0)
    assert [s for s, _ in list_checkpoints(tmp_path / "all")] == [1, 2, 3]  # 0 = keep every checkpoint
    _save(tmp_path / "one", 1, keep=1)
    _save(tmp_path / "one", 2, keep=1)
    assert [s for s, _ in list_checkpoints(tmp_path / "one")] == [2]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_damaged_newest_checkpoint_is_skipped(tmp_path):
    root = tmp_path / "ck"
    for s in (1, 2, 3):
        _save(root, s, keep=0)
    (root / "step-000003" / "trainer_state.safetensors").write_bytes(b"")  # the 0-byte state file of the issue
    assert "trainer_state.safetensors has 0 bytes" in verify_checkpoint(root / "step-000003")
    (root / "step-000002" / "manifest.json").unlink()
    ckpt, skipped = newest_intact_checkpoint(root)
    assert ckpt.name == "step-000001" and [p.name for p, _ in skipped] == ["step-000003", "step-000002"]
    with pytest.raises(ValueError, match="is not intact: no manifest.json"):
        load_checkpoint(root / "step-000002")
    w = root / "step-000001" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-1] + b"\x00")
    assert "does not match its SHA-256" in verify_checkpoint(root / "step-000001")


def test_a_failed_write_leaves_no_checkpoint(tmp_path):
    """A real failed write: past a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) in a child process, the real safetensors
    writer raises its own SafetensorError; save_checkpoint names the file and leaves the earlier checkpoint alone."""
    script = textwrap.dedent(f"""
        import resource, signal, sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_runs import _Weights
        from slca._fs import WriteError
        from slca.training.runs import save_checkpoint
        root = {str(tmp_path / "ck")!r}
        save_checkpoint(root, 1, model=_Weights(), tokenizer=None, state={{"step": 1}}, keep=2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        big = _Weights()
        big.w = torch.nn.Parameter(torch.zeros(4096))
        try:
            save_checkpoint(root, 2, model=big, tokenizer=None, state={{"step": 2}}, keep=2)
        except WriteError as e:
            print("WriteError", e.errno, e, type(e.__cause__).__name__)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    root = tmp_path / "ck"
    assert r.stdout.strip() == (f"WriteError 27 {root / 'step-000002' / 'model.safetensors'}: could not write the checkpoint of step 2 "
                                "(File too large, EFBIG); nothing of it was kept, the earlier checkpoints are intact SafetensorError")
    assert [s for s, _ in list_checkpoints(root)] == [1] and not list(root.glob(".tmp-*"))
    assert verify_checkpoint(root / "step-000001") is None


def test_pickled_state_is_never_loaded(tmp_path):
    """A crafted trainer_state.pt (the old format) would run code if unpickled."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    d = tmp_path / "run" / "checkpoints" / "step-000001"
    d.mkdir(parents=True)
    (d / "trainer_state.pt").write_bytes(pickle.dumps({"step": Evil()}))
    _Weights().save_pretrained(d)
    assert "pickled trainer_state.pt" in verify_checkpoint(d)
    cfg = validate(TrainConfig(run_dir=str(tmp_path / "run")))
    (tmp_path / "run" / "config.json").write_text(json.dumps(to_dict(cfg)))
    with pytest.raises(ConfigError, match="--resume: no intact checkpoint .*pickled trainer_state.pt"):
        RunFolder(cfg, resume=True).open()
    assert not marker.exists()


# ---------------------------------------------------------------- JSONL


def test_torn_tail_dropped_other_bad_lines_named(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "lo')
    assert read_jsonl(p) == [{"step": 0}, {"step": 1}]
    p.write_text('{"step": 0}\n{"step": 1\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record"):
        read_jsonl(p)
    p.write_text('{"step": 0}\n[1]\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: a record must be a JSON object"):
        read_jsonl(p)
    p.write_bytes(b'{"step": 0}\n{"step": 1, "x": "\xe2')  # torn inside a UTF-8 character
    assert read_jsonl(p) == [{"step": 0}]


def test_report_reads_a_run_with_a_torn_tail(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "reward/tool": 0.1 * i, "reward/summary": 0.5, "eval/success": 0.25} for i in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew')
    res = CliRunner().invoke(app, ["report", str(run)])
    assert res.exit_code == 0, res.output
    assert (run / "report.md").exists()
    (run / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    res = CliRunner().invoke(app, ["report", str(run)])
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {run / 'metrics.jsonl'}:2: not a JSON record"), res.output
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "samples.json").write_text('[{"step": 0, "rollo')
    res = CliRunner().invoke(app, ["report", str(run)])
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {run / 'samples.json'} is not valid JSON"), res.output


# ---------------------------------------------------------------- run folders


def _cfg(tmp_path, **kw):
    return validate(TrainConfig(run_dir=str(tmp_path / "run"), **kw))


def _fake_run(tmp_path, cfg, steps_saved=(1,)):
    with RunFolder(cfg):
        pass
    for s in steps_saved:
        _save(tmp_path / "run" / "checkpoints", s, state={"config": to_dict(cfg)})
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in range(max(steps_saved, default=0))))


def test_existing_run_needs_resume_or_overwrite(tmp_path):
    cfg = _cfg(tmp_path, steps=5)
    _fake_run(tmp_path, cfg, (1, 2))
    with pytest.raises(ConfigError, match=r"run_dir: .* already holds a run; pass --resume to continue it or --overwrite"):
        RunFolder(cfg).open()
    with RunFolder(cfg, resume=True) as run:
        assert run.checkpoint.name == "step-000002"
    with RunFolder(dataclasses.replace(cfg, steps=8), resume=True) as run:  # steps may change: extend a run
        assert run.checkpoint.name == "step-000002" and "steps: 5 -> 8" in run.notes
    with pytest.raises(ConfigError, match=r"steps: 1 is below the step of the newest checkpoint"):
        RunFolder(dataclasses.replace(cfg, steps=1), resume=True).open()
    with pytest.raises(ConfigError) as e:
        RunFolder(dataclasses.replace(cfg, steps=8, lr=1e-3, estimator="grpo"), resume=True).open()
    assert str(e.value).startswith("--resume: the config differs from the run's config.json: estimator: 'slca' -> 'grpo'; lr: 0.0002 -> 0.001")
    with RunFolder(cfg, overwrite=True) as run:
        assert run.checkpoint is None
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json"]


def test_resume_moves_broken_newer_checkpoints_aside(tmp_path):
    cfg = _cfg(tmp_path, steps=5)
    _fake_run(tmp_path, cfg, (1, 2))
    (tmp_path / "run" / "checkpoints" / "step-000002" / "trainer_state.json").write_text("{")
    (tmp_path / "run" / "checkpoints" / ".tmp-step-000003-x").mkdir()  # a write a kill interrupted
    with RunFolder(cfg, resume=True) as run:
        assert run.checkpoint.name == "step-000001"
        assert any("skipped checkpoint step-000002" in n for n in run.notes)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["broken-step-000002", "step-000001"]


def test_one_process_per_run_folder(tmp_path):
    cfg = _cfg(tmp_path)
    with RunFolder(cfg):
        with pytest.raises(ConfigError, match="run_dir: .* is in use by another slca process"):
            RunFolder(cfg, overwrite=True).open()
    with RunFolder(cfg, resume=True):  # released
        pass


def test_overwrite_never_empties_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "precious.txt").write_text("x")
    with pytest.raises(ConfigError, match="--overwrite will not empty it"):
        RunFolder(validate(TrainConfig(run_dir=".")), overwrite=True).open()
    assert (tmp_path / "precious.txt").exists()


# ---------------------------------------------------------------- what resume may change, what a run may replace


def test_resume_may_change_what_leaves_the_result_as_it_is(tmp_path):
    cfg = _cfg(tmp_path, steps=5)
    _fake_run(tmp_path, cfg, (1, 2))
    light = dataclasses.replace(cfg, micro_batch_size=2, eval_every=3, diag_every=0, volatility_window=4, sample_html_every=0,
                                save_every=1, keep_checkpoints=1, report_to=["none"], project="other")
    with RunFolder(light, resume=True) as run:
        assert run.checkpoint.name == "step-000002"
        assert "micro_batch_size: 0 -> 2" in run.notes and "keep_checkpoints: 2 -> 1" in run.notes and "project: 'slca' -> 'other'" in run.notes
    assert json.loads((tmp_path / "run" / "config.json").read_text())["micro_batch_size"] == 2  # the run goes on with it
    for field, value in (("fast_paths", False), ("minibatches", 1), ("eval_tasks", 8), ("dtype", "bfloat16")):  # these change it
        with pytest.raises(ConfigError, match=rf"--resume: the config differs from the run's config.json: {field}: "):
            RunFolder(dataclasses.replace(light, **{field: value}), resume=True).open()


def test_overwrite_deletes_the_runs_files_and_nothing_else(tmp_path):
    cfg = _cfg(tmp_path, steps=5)
    _fake_run(tmp_path, cfg, (1,))
    run_dir = tmp_path / "run"
    (run_dir / "notes.md").write_text("mine")
    (run_dir / "data").mkdir()
    (run_dir / ".config.json.abc123.tmp").write_text("{")  # an interrupted write of the run's own
    (run_dir / "report.md").write_text("# slca run report")
    with RunFolder(cfg, overwrite=True):
        pass
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "data", "notes.md"]


def test_a_folder_with_a_file_a_run_would_replace_is_refused(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "README.md").write_text("mine")
    cfg = validate(TrainConfig(run_dir=str(proj)))
    with RunFolder(cfg):  # files of other names: the run's files go beside them
        pass
    (proj / "config.json").unlink()
    (proj / "config.json").write_text('{"name": "my project"}')
    for kw in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(ConfigError, match=r"run_dir: .* holds config.json, which a run writes, but no run"):
            RunFolder(cfg, **kw).open()
    assert (proj / "config.json").read_text() == '{"name": "my project"}'


def test_a_start_that_failed_after_writing_its_records_does_not_block_the_next(tmp_path):
    """A start that failed after config.json and model.json were written (a chat template refused at the first
    rollout) left the run's own files: the next start goes ahead; a model.json of other fields is a stranger's."""
    from slca.training.runs import write_model_record

    run_dir = tmp_path / "run"
    cfg = validate(TrainConfig(run_dir=str(run_dir)))
    with RunFolder(cfg) as run:
        run.commit()
    write_model_record(run_dir, cfg.model, "default:0123")
    with RunFolder(cfg):
        pass
    (run_dir / "model.json").write_text('{"name": "my model card"}')
    with pytest.raises(ConfigError, match=r"run_dir: .* holds model.json, which a run writes, but no run"):
        RunFolder(cfg).open()
    assert (run_dir / "model.json").read_text() == '{"name": "my model card"}'


def test_compare_reuses_a_run_that_differs_only_where_its_records_do_not(tmp_path):
    from slca.training.runs import write_model_record
    from slca.models.named import model_fingerprint

    out = tmp_path / "cmp"
    sets = ["steps=2", "tasks_per_step=2"]
    sp = RunSpec("grpo", 0, out / "grpo-seed0")
    cfg = validate(TrainConfig(run_dir=str(sp.run_dir), estimator="grpo", seed=0, steps=2, tasks_per_step=2))
    with RunFolder(cfg):
        pass
    write_model_record(sp.run_dir, cfg.model, model_fingerprint(cfg.model))
    _save(sp.run_dir / "checkpoints", 1)
    assert run_status(sp, sets) == ("resume", [])
    assert run_status(sp, [*sets, "micro_batch_size=2", "save_every=1", "keep_checkpoints=1", "report_to=none"]) == ("resume", [])
    assert run_status(sp, [*sets, "eval_every=1"]) == ("differs", ["eval_every: 10 -> 1"])  # the report's curve would change
