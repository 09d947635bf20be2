"""Kill real `slca train` processes (SIGKILL) at seeded random points, checkpoint
writes included, resume each time, and get the metrics of an uninterrupted run; resume
a killed run with a smaller micro_batch_size and get them up to float rounding.

The kill points are file-system events of the process (tests/_killhook.py): the
state a run leaves on disk can only change at one of them, so a kill before a
random one of them is a kill at a random point of the run as far as the disk can
tell. One more kill comes from outside, at a random time.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from _slca_procs import in_process

HOOK = str(Path(__file__).with_name("_killhook.py"))
SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false")


def _cmd(model: Path, run: Path, kill_at: str = "0", log: str = "-", resume: bool = False) -> list[str]:
    sets = [f"model={model}", f"run_dir={run}", "steps=4", "tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=8",
            "eval_every=2", "eval_tasks=2", "save_every=1", "keep_checkpoints=2", "summary_noise=0.5", "minibatches=1",
            "kl_coef=0.05", "sample_html_every=1"]
    cmd = [sys.executable, HOOK, str(run), log, kill_at, "--", "train"]
    for s in sets:
        cmd += ["--set", s]
    return cmd + (["--resume"] if resume else [])


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # timings differ between any two runs


@pytest.mark.slow
def test_sigkill_anywhere_then_resume_gives_the_uninterrupted_metrics(tmp_path, tiny_model_dir):
    ref, log = tmp_path / "ref", tmp_path / "ref.events"
    r = _run(_cmd(tiny_model_dir, ref, log=str(log)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    events = log.read_text().splitlines()
    in_ckpt = [i for i, e in enumerate(events, 1) if ".tmp-step-" in e]
    assert len(in_ckpt) >= 4 * 8  # four checkpoint writes, each many events

    rng = random.Random(1616)
    run = tmp_path / "run"
    kills = [
        str(rng.choice(in_ckpt)),                         # a fresh run, inside a checkpoint write
        f"{rng.randint(1, 12)}:.tmp-step-",               # resumed, inside its first checkpoint write
        "1:os.rename\tcheckpoints/.tmp-step-",            # resumed, a complete temporary checkpoint not yet renamed
        f"{rng.randint(1, 2)}:metrics.jsonl",             # resumed, while logging a step
    ]
    for i, k in enumerate(kills):
        r = _run(_cmd(tiny_model_dir, run, kill_at=k, resume=i > 0))
        assert r.returncode == -signal.SIGKILL, (k, r.stdout[-3000:], r.stderr[-3000:])
        if i > 0:
            assert "resumed from step" in r.stdout or "no checkpoint yet" in r.stdout, r.stdout[-3000:]
        if k.startswith("1:os.rename"):
            assert list((run / "checkpoints").glob(".tmp-step-*")), "the kill left a complete but unrenamed checkpoint"
    # resumed, killed from outside after a random delay
    p = subprocess.Popen(_cmd(tiny_model_dir, run, resume=True), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    time.sleep(rng.uniform(2.0, 8.0))
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    # a torn last line, as a kill in the middle of an append leaves
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 0.12')
    r = _run(_cmd(tiny_model_dir, run, resume=True))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from step" in r.stdout
    assert _metrics(run) == _metrics(ref)  # exactly: every float of every step
    assert not list((run / "checkpoints").glob(".tmp-*")) and not list((run / "checkpoints").glob(".del-*"))
    assert [p.name for p in sorted((run / "checkpoints").glob("step-*"))] == ["step-000003", "step-000004"]


def _numbers_close(a: dict, b: dict, rel: float = 1e-4, abs_: float = 1e-6) -> list[str]:
    """Keys of two records that differ: numbers beyond the tolerance (float rounding of another summation order, on any
    CPU), anything else not equal."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            if y != pytest.approx(x, rel=rel, abs=abs_, nan_ok=True):
                out.append(f"{k}: {x} vs {y}")
        elif x != y:
            out.append(f"{k}: {x!r} vs {y!r}")
    return out


@pytest.mark.slow
def test_a_run_killed_for_memory_resumes_with_a_smaller_micro_batch(tmp_path, tiny_model_dir):
    """The fix for a run the kernel killed for memory: resume it with a smaller micro_batch_size. The update is the same
    up to float rounding, so the next steps' records and weights match the run left alone."""
    from safetensors.torch import load_file

    sets = [f"model={tiny_model_dir}", "steps=3", "tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=8", "eval_every=0",
            "eval_tasks=2", "save_every=1", "keep_checkpoints=0", "summary_noise=0.5", "minibatches=1", "kl_coef=0.05",
            "report_to=none", "micro_batch_size=0"]

    def cmd(run: Path, kill_at: str) -> list[str]:
        return [sys.executable, HOOK, str(run), "-", kill_at, "--", "train", *[x for s in [*sets, f"run_dir={run}"] for x in ("--set", s)]]

    ref, run = tmp_path / "ref", tmp_path / "run"
    r = in_process("train", *[x for s in [*sets, f"run_dir={ref}"] for x in ("--set", s)])  # the run left alone: no kill, no process
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = _run(cmd(run, "2:metrics.jsonl"))  # SIGKILL while logging step 2: the checkpoint of step 1 is on disk
    assert r.returncode == -signal.SIGKILL, r.stdout[-3000:] + r.stderr[-3000:]
    assert [p.name for p in sorted((run / "checkpoints").glob("step-*"))] == ["step-000001"]
    r = _run([sys.executable, "-m", "slca.cli", "train", "--resume", str(run), "--set", "micro_batch_size=1"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[slca] micro_batch_size: 0 -> 1" in r.stdout and "resumed from step 1" in r.stdout
    assert json.loads((run / "config.json").read_text())["micro_batch_size"] == 1
    got, want = _metrics(run), _metrics(ref)
    assert [x["step"] for x in got] == [x["step"] for x in want] == [1, 2, 3]
    assert got[0] == want[0]  # step 1: from before the kill, as it was
    for a, b in zip(want[1:], got[1:]):  # steps 2 and 3: updates in 4 slices of one row instead of one of 4 rows
        assert not _numbers_close(a, b), (a["step"], _numbers_close(a, b))
    for step in ("step-000002", "step-000003"):
        wa, wb = (load_file(str(d / "checkpoints" / step / "model.safetensors")) for d in (ref, run))
        assert wa.keys() == wb.keys()
        for k in wa:
            assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-6), (step, k, float((wa[k] - wb[k]).abs().max()))
