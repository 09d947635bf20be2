"""Files that fail as they do on a user's disk (docs/runs.md, "Failure behaviour"): weights cut short, a write that the
system refuses (a file-size limit, a full disk, a read-only folder). Each is provoked for real on a real ``slca``
process; each must end in one ``error:`` line naming the file, exit 2, and nothing lost: the run resumes from its
newest checkpoint once the cause is gone (that resumption, with no fault left to provoke, runs in this process)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _slca_procs import ENV, SLCA, in_process, sets

SMALL = ["tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=8", "eval_every=0", "eval_tasks=2", "minibatches=1",
         "report_to=none", "ood_splits=none", "save_every=1", "keep_checkpoints=2"]


def slca(*args: str, preexec=None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*SLCA, *args], capture_output=True, text=True, timeout=timeout, env=ENV, preexec_fn=preexec)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def _cut_short(f: Path, keep: float = 0.5) -> None:
    """An interrupted copy or download: the file's first part only."""
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * keep)])


def _train(model: Path, run: Path, steps: int, *extra: str, preexec=None) -> subprocess.CompletedProcess:
    return slca("train", *sets(*SMALL, f"model={model}", f"run_dir={run}", f"steps={steps}", *extra), preexec=preexec)


def _trained(model: Path, run: Path, steps: int) -> None:
    """A run to provoke faults on, trained in this process (its training is not what is under test)."""
    r = in_process("train", *sets(*SMALL, f"model={model}", f"run_dir={run}", f"steps={steps}"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def _resume(run: Path, steps: int, preexec=None) -> subprocess.CompletedProcess:
    return slca("train", "--resume", str(run), *sets(f"steps={steps}"), preexec=preexec)


def _resumed(run: Path, steps: int) -> subprocess.CompletedProcess:
    """The run continued once the cause is gone, in this process: no fault is provoked, so the process is not what is
    under test (a process costs ~8 CPU s of imports)."""
    return in_process("train", "--resume", str(run), *sets(f"steps={steps}"))


def _steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


# ---------------------------------------------------------------- weights cut short


def test_model_weights_cut_short_are_one_error_line_naming_the_file(tmp_path, tiny_model_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    _cut_short(model / "model.safetensors")
    weights = model / "model.safetensors"
    # a refusal at the start: the command line's own handling, run in this process (the process is not under test)
    line = one_error_line(in_process("train", *sets(*SMALL, f"model={model}", f"run_dir={tmp_path / 'run'}", "steps=1")))
    assert line.startswith(f"error: model '{model}': {weights}: cut short or corrupt, not a whole safetensors file ("), line
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
    line = one_error_line(in_process("eval", "--model", str(model), "--suite", "toolworld", "--limit", "2", "--out", str(tmp_path / "ev")))
    assert line.startswith(f"error: --model '{model}': {weights}: cut short or corrupt"), line
    assert not (tmp_path / "ev").exists()


def test_a_checkpoint_cut_short_is_set_aside_and_the_run_resumes_from_the_one_before(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    _trained(tiny_model_dir, run, 2)
    weights = run / "checkpoints" / "step-000002" / "model.safetensors"
    _cut_short(weights)
    # the checkpoint as a model: one line naming the file
    line = one_error_line(slca("eval", "--model", str(weights.parent), "--suite", "toolworld", "--limit", "2", "--out", str(tmp_path / "ev")))
    assert f"{weights}: cut short or corrupt" in line, line
    # resumed: the damaged one is kept aside (never loaded, never deleted), step 2 is trained again
    r = _resumed(run, 3)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[slca] skipped checkpoint step-000002 (model.safetensors has" in r.stdout and "resumed from step 1" in r.stdout
    assert _checkpoints(run) == ["broken-step-000002", "step-000002", "step-000003"] and _steps(run) == [1, 2, 3]
    # every checkpoint damaged: refused, nothing deleted
    for w in (run / "checkpoints").glob("step-*/model.safetensors"):
        _cut_short(w)
    line = one_error_line(_resume(run, 4))
    assert line.startswith(f"error: --resume: no intact checkpoint in '{run / 'checkpoints'}' (step-000003: model.safetensors has "), line
    assert _checkpoints(run) == ["broken-step-000002", "step-000002", "step-000003"]


# ---------------------------------------------------------------- writes the system refuses


def _file_size_limit(limit: int):
    """``preexec_fn``: files of this process may not grow past ``limit`` bytes (RLIMIT_FSIZE); SIGXFSZ ignored, so a
    write past it fails with EFBIG as a write to a full disk fails with ENOSPC."""
    def pre() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return pre


def test_a_checkpoint_write_past_the_file_size_limit_is_one_line_and_loses_nothing(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    _trained(tiny_model_dir, run, 1)
    before = {p.name: p.read_bytes() for p in (run / "checkpoints" / "step-000001").iterdir()}
    # the weights (128 KB) do not fit under 60 KB: the real safetensors writer fails (SafetensorError, not OSError)
    line = one_error_line(_resume(run, 2, preexec=_file_size_limit(60_000)))
    assert line == (f"error: {run / 'checkpoints' / 'step-000002' / 'model.safetensors'}: could not write the checkpoint of step 2 "
                    "(File too large, EFBIG); nothing of it was kept, the earlier checkpoints are intact; once it can write there: "
                    f"slca train --resume {run}"), line
    assert _checkpoints(run) == ["step-000001"]  # no step-2 folder, no temporary folder left
    assert {p.name: p.read_bytes() for p in (run / "checkpoints" / "step-000001").iterdir()} == before
    r = _resumed(run, 2)  # the limit gone: the run continues from step 1
    assert r.returncode == 0 and "resumed from step 1" in r.stdout, r.stderr[-3000:]
    assert _steps(run) == [1, 2] and _checkpoints(run) == ["step-000001", "step-000002"]


def _no_root_override():
    """``preexec_fn``: as root, give up the capability to write where the permissions say no (so that a read-only folder
    is read-only, as for any user); elsewhere nothing."""
    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def pre() -> None:
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: dropped from the bounding set, so exec leaves them out
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    return pre


def _read_only_applies(tmp_path: Path):
    """The ``preexec_fn`` under which a read-only folder is read-only (:func:`_no_root_override`); skips the test where
    even that writes into one."""
    pre = _no_root_override()
    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0o555)
    try:
        r = subprocess.run(["touch", str(probe / "x")], preexec_fn=pre, capture_output=True)
    except subprocess.SubprocessError as e:
        pytest.skip(f"cannot give up root's override here ({e})")
    if r.returncode == 0:
        pytest.skip("this user writes into a read-only folder")
    return pre


def test_a_read_only_folder_is_one_line_and_loses_nothing(tmp_path, tiny_model_dir):
    pre = _read_only_applies(tmp_path)
    run = tmp_path / "run"
    _trained(tiny_model_dir, run, 1)
    ckpts = run / "checkpoints"
    ckpts.chmod(0o555)
    try:
        line = one_error_line(_resume(run, 2, preexec=pre))
        assert line.startswith(f"error: {ckpts / 'step-000002'}: could not write the checkpoint of step 2 (Permission denied, EACCES); "
                               "nothing of it was kept, the earlier checkpoints are intact; once it can write there: "), line
        run.chmod(0o555)  # the run folder itself: its config.json cannot be written
        line = one_error_line(_resume(run, 2, preexec=pre))
        assert line.startswith(f"error: {run / 'config.json'}: could not write (Permission denied, EACCES)"), line
    finally:
        run.chmod(0o755)
        ckpts.chmod(0o755)
    assert _checkpoints(run) == ["step-000001"]
    r = _resumed(run, 2)
    assert r.returncode == 0 and "resumed from step 1" in r.stdout, r.stderr[-3000:]
    assert _steps(run) == [1, 2]
    # the token page written at the end cannot be replaced: the run itself is complete, and says how to write it again
    (run / "tokens.html").chmod(0o444)
    line = one_error_line(_resume(run, 3, preexec=pre))
    assert line == (f"error: {run / 'tokens.html'}: could not write the token page (Permission denied, EACCES); the run is complete: "
                    f"slca report {run} writes it again"), line
    assert _steps(run) == [1, 2, 3] and "step-000003" in _checkpoints(run)


def test_compare_and_eval_into_a_folder_they_cannot_write_are_one_line(tmp_path, tiny_model_dir):
    pre = _read_only_applies(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        r = slca("compare", "--estimators", "grpo", "--seeds", "0", "--out", str(locked / "cmp"),
                 *sets(f"model={tiny_model_dir}", "steps=1", *SMALL), preexec=pre)
        line = one_error_line(r)
        assert line == f"error: {locked / 'cmp'}: could not write the comparison's folder (Permission denied, EACCES)", line
        r = slca("eval", "--model", str(tiny_model_dir), "--suite", "toolworld", "--limit", "2", "--max-new-tokens", "8",
                 "--out", str(locked / "ev"), preexec=pre)
        line = one_error_line(r)
        assert line == f"error: {locked / 'ev'}: could not write the evaluation report (Permission denied, EACCES)", line
    finally:
        locked.chmod(0o755)
    assert list(locked.iterdir()) == []


@contextlib.contextmanager
def _tiny_disk(where: Path, size: str):
    """A tmpfs of ``size`` mounted at ``where`` (root only; skips where it cannot be mounted), unmounted afterwards."""
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="mounts a tmpfs (root on Linux)")
def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path, tiny_model_dir):
    with _tiny_disk(tmp_path / "disk", "600k") as disk:
        run = disk / "run"
        r = _train(tiny_model_dir, run, 3)  # one checkpoint (~420 KB) fits, the second does not
        line = one_error_line(r)
        assert line.startswith(f"error: {run / 'checkpoints' / 'step-000002'}"), line
        assert "could not write the checkpoint of step 2 (No space left on device, ENOSPC); nothing of it was kept" in line, line
        assert _checkpoints(run) == ["step-000001"] and _steps(run) == [1, 2]
        saved = tmp_path / "moved"  # the user frees space: here, by moving the run to a disk with room
        shutil.copytree(run, saved)
    r = _resumed(saved, 3)
    assert r.returncode == 0 and "resumed from step 1" in r.stdout, r.stderr[-3000:]
    assert _steps(saved) == [1, 2, 3]
