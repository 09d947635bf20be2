"""Run folders and checkpoints: nothing lost, nothing spliced, nothing unpickled.

A run folder holds ``config.json``, ``metrics.jsonl`` (one JSON record per
step), ``checkpoints/step-NNNNNN/`` and the reports. The rules (docs/runs.md):

* An existing run folder is reused only with ``resume=True`` (same config,
  except :data:`RESUME_MAY_CHANGE`) or replaced with ``overwrite=True`` (the run's
  own files, :data:`RUN_FILES`, deleted; nothing else); one process at a time
  (a lock on the folder).
* A checkpoint is written into ``checkpoints/.tmp-*`` and renamed into place
  once every file is on disk, with a ``manifest.json`` of sizes and SHA-256
  digests. Resume takes the newest checkpoint whose manifest checks out.
* Trainer state is JSON plus a safetensors file of its tensors (no pickle):
  :func:`encode_state` / :func:`decode_state` split and join them.
* ``metrics.jsonl`` may end in a torn line (a kill mid-write): :func:`read_jsonl`
  drops it; a bad line anywhere else is an error naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from slca._fs import fsync_dir as _fsync_dir, temp_dir, umask_modes, write_atomic, write_error, writing
from slca.training.config import ConfigError, TrainConfig, config_diff, read_stored_config, to_dict

__all__ = ["read_metrics", 
    "RunFolder", "read_jsonl", "write_atomic", "save_checkpoint", "verify_checkpoint", "list_checkpoints",
    "newest_intact_checkpoint", "load_checkpoint", "encode_state", "decode_state", "rng_state", "set_rng_state",
    "RESUME_MAY_CHANGE", "RUN_FILES", "checkpoint_step",
]

CKPT_PREFIX = "step-"
MANIFEST = "manifest.json"
STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
FORMAT_VERSION = 1
RUN_MARKERS = ("metrics.jsonl", "checkpoints")
"""What makes a folder hold a run (something to lose); a lone config.json of a start that failed does not."""
RESUME_MAY_CHANGE = ("steps", "micro_batch_size", "eval_batch_size", "eval_every", "diag_every", "volatility_window", "sample_html_every",
                     "save_every", "keep_checkpoints", "report_to", "project", "mask_check_max_mismatch")
"""Fields ``--resume`` lets differ from the stored config: ``steps`` (extend a run) and those that leave every update
as it is, up to float rounding: ``micro_batch_size`` (rows per forward and backward: the same gradient, summed in
another order; the fix for a run killed for memory), ``eval_batch_size`` (tasks rolled out together in an
evaluation: each row decodes as it would alone), when the run evaluates (``eval_every``), computes and logs
diagnostics (``diag_every``: the per-segment gradients, two backward passes summing to the same gradient;
``volatility_window``; ``sample_html_every``; ``mask_check_max_mismatch``: when a mask check stops the run), checkpoints (``save_every``, ``keep_checkpoints``) and where it reports
(``report_to``, ``project``). Evaluation and checkpoints draw no random numbers of training (rollouts and
minibatches are seeded by step). Anything else (the data, the model, the estimator, the optimizer, the device or
dtype, ``fast_paths``, what an evaluation measures) is refused: it would change the result."""
RUN_FILES = ("config.json", "model.json", "metrics.jsonl", "checkpoints", "samples.json", "tb", "wandb", "report.md", "curves.png",
             "tokens.html")
"""What ``slca train`` writes into a run folder: all that ``--overwrite`` deletes (with the temporary files of an
interrupted write of them); anything else in the folder is left as it is."""


# --------------------------------------------------------------------------- files


MODEL_FILE = "model.json"
"""The run's model record: ``{"model": cfg.model, "fingerprint": ...}`` (:func:`slca.models.named.model_fingerprint`)."""


def read_model_record(run_dir: str | Path) -> dict[str, Any] | None:
    """The run folder's ``model.json``, or None when it has none (records written before it existed) or it is unreadable."""
    try:
        rec = json.loads((Path(run_dir) / MODEL_FILE).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def model_record_problem(run_dir: str | Path, model: str, fingerprint: str) -> str | None:
    """Why the records in ``run_dir`` do not belong to ``model`` with ``fingerprint`` (one line), or None if they do."""
    rec = read_model_record(run_dir)
    if rec is None:
        return f"{MODEL_FILE} missing: the records do not say which model they were trained from (now {fingerprint})"
    if rec.get("fingerprint") != fingerprint:
        return f"model fingerprint: {rec.get('fingerprint')!r} in the records, {fingerprint!r} now ({model})"
    return None


def write_model_record(run_dir: str | Path, model: str, fingerprint: str) -> None:
    write_atomic(Path(run_dir) / MODEL_FILE, json.dumps({"model": model, "fingerprint": fingerprint}, indent=2) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (no newline, not JSON) is dropped.

    Raises:
        ValueError: naming the file and line, for a bad line that is not the torn tail.
    """
    path = Path(path)
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    rows: list[dict[str, Any]] = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        torn_tail = i == len(lines) - 1  # the file does not end in a newline after this line
        try:
            rec = json.loads(ln)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if torn_tail:
                continue  # a process killed while appending this record; the record was never complete
            raise ValueError(f"{path}:{i + 1}: not a JSON record ({getattr(e, 'msg', e)})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{i + 1}: a record must be a JSON object, got {type(rec).__name__}")
        rows.append(rec)
    return rows


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- state without pickle


def encode_state(obj: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split ``obj`` into a JSON-able structure and a flat dict of tensors.

    Tensors and numpy arrays become ``{"$tensor": key}`` / ``{"$ndarray": key, "dtype": ...}``;
    tuples ``{"$tuple": [...]}``; dicts with non-string keys ``{"$items": [[k, v], ...]}``.
    """
    tensors: dict[str, torch.Tensor] = {}

    def enc(x: Any, path: str) -> Any:
        if isinstance(x, torch.Tensor):
            tensors[path] = x.detach().to("cpu").contiguous().clone()  # clone: no shared storage (tied weights)
            return {"$tensor": path}
        if isinstance(x, np.ndarray):
            tensors[path] = torch.from_numpy(x.astype(np.int64) if x.dtype.kind in "iu" else x.copy())
            return {"$ndarray": path, "dtype": str(x.dtype)}
        if isinstance(x, tuple):
            return {"$tuple": [enc(v, f"{path}/{i}") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [enc(v, f"{path}/{i}") for i, v in enumerate(x)]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: enc(v, f"{path}/{k}") for k, v in x.items()}
            return {"$items": [[enc(k, f"{path}/k{i}"), enc(v, f"{path}/{i}")] for i, (k, v) in enumerate(x.items())]}
        if isinstance(x, np.generic):
            return x.item()
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"encode_state: cannot store a {type(x).__name__} at {path!r}")

    return enc(obj, "state"), tensors


def decode_state(meta: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`encode_state`."""

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if isinstance(x, dict):
            if "$tensor" in x:
                return tensors[x["$tensor"]]
            if "$ndarray" in x:
                return tensors[x["$ndarray"]].numpy().astype(x["dtype"])
            if "$tuple" in x:
                return tuple(dec(v) for v in x["$tuple"])
            if "$items" in x:
                return {_hashable(dec(k)): dec(v) for k, v in x["$items"]}
            return {k: dec(v) for k, v in x.items()}
        return x

    return dec(meta)


def _hashable(k: Any) -> Any:
    return tuple(_hashable(v) for v in k) if isinstance(k, list) else k


def rng_state() -> dict[str, Any]:
    """Every global random state a step uses: torch (CPU and CUDA), Python, numpy."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"torch": torch.get_rng_state(), "cuda": list(cuda), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    if st.get("cuda"):
        torch.cuda.set_rng_state_all(st["cuda"])
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])


# --------------------------------------------------------------------------- checkpoints


def _step_of(d: Path) -> int | None:
    tail = d.name[len(CKPT_PREFIX):]
    return int(tail) if d.name.startswith(CKPT_PREFIX) and tail.isdigit() else None


def checkpoint_step(d: str | Path) -> int | None:
    """The step of a ``step-N`` checkpoint folder (None for another name)."""
    return _step_of(Path(d))


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``step-N`` folder under ``root``, oldest first (by step number)."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = [(s, d) for d in root.iterdir() if d.is_dir() and (s := _step_of(d)) is not None]
    return sorted(out)


def _remove_leftovers(root: Path) -> None:
    """Temporary folders of saves or removals a killed process did not finish."""
    for d in root.glob(".tmp-*"):
        shutil.rmtree(d, ignore_errors=True)
    for d in root.glob(".del-*"):
        shutil.rmtree(d, ignore_errors=True)


def save_checkpoint(root: str | Path, step: int, *, model: Any, tokenizer: Any, state: dict[str, Any], keep: int) -> Path:
    """Write ``root/step-{step}`` atomically and keep the ``keep`` newest (0 = all).

    The model (``save_pretrained``, safetensors), the tokenizer, ``state`` as
    JSON + safetensors, and a manifest are written into a temporary folder,
    flushed to disk, then renamed into place: a kill at any point leaves either
    the complete checkpoint or none.
    """
    root = Path(root)
    final = root / f"{CKPT_PREFIX}{step:06d}"
    what, after = f"the checkpoint of step {step}", "nothing of it was kept, the earlier checkpoints are intact"
    with writing(final, what, after=after, named=False):
        root.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(root)
        tmp = temp_dir(f".tmp-{final.name}-", root)
    current = ""  # the file being written, for the error of a failed write
    try:
        current = "adapter_model.safetensors" if hasattr(model, "peft_config") else "model.safetensors"
        model.save_pretrained(tmp, safe_serialization=True)  # config.json, generation_config.json, then the weights
        if tokenizer is not None:
            current = "tokenizer.json"
            tokenizer.save_pretrained(tmp)
        meta, tensors = encode_state(state)
        current = STATE_TENSORS
        save_file(tensors, str(tmp / STATE_TENSORS))
        current = STATE_JSON
        (tmp / STATE_JSON).write_text(json.dumps({"format": FORMAT_VERSION, "step": step, "state": meta}))
        current = ""
        umask_modes(tmp)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
                files[p.relative_to(tmp).as_posix()] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        manifest = tmp / MANIFEST
        current = MANIFEST
        with open(manifest, "w") as f:
            json.dump({"format": FORMAT_VERSION, "step": step, "files": files}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again: move the old one out of the way first
            final.rename(root / f".del-{final.name}-{os.getpid()}")
        current = ""
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        name = getattr(e, "filename", None)
        if isinstance(name, str) and Path(name).parent == tmp:
            current = Path(name).name  # the file the system named, in the checkpoint's temporary folder
        err = write_error(final / current if current else final, e, what, after=after, named=False)
        if err is not None:
            raise err from e
        raise
    if keep > 0:
        for _, old in list_checkpoints(root)[:-keep]:
            gone = root / f".del-{old.name}-{os.getpid()}"
            old.rename(gone)  # atomic: a kill mid-removal never leaves a half-deleted step-N folder
            shutil.rmtree(gone, ignore_errors=True)
    _remove_leftovers(root)
    return final


def verify_checkpoint(d: str | Path) -> str | None:
    """None if ``d`` is a complete checkpoint; otherwise why it is not."""
    d = Path(d)
    if (d / "trainer_state.pt").exists() and not (d / MANIFEST).exists():
        return "written by an older slca (pickled trainer_state.pt, which is not loaded: unpickling can run code)"
    try:
        man = json.loads((d / MANIFEST).read_text())
        files = man["files"]
    except FileNotFoundError:
        return "no manifest.json (an incomplete write)"
    except (ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest.json ({e})"
    if man.get("format") != FORMAT_VERSION:
        return f"checkpoint format {man.get('format')!r}, this slca reads {FORMAT_VERSION}"
    if _step_of(d) is not None and man.get("step") != _step_of(d):
        return f"manifest says step {man.get('step')!r}, folder name says {_step_of(d)}"
    for name in (STATE_JSON, STATE_TENSORS):
        if name not in files:
            return f"the manifest lists no {name}"
    for name, info in files.items():
        p = d / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != info.get("bytes"):
            return f"{name} has {p.stat().st_size} bytes, the manifest says {info.get('bytes')}"
        if _sha256(p) != info.get("sha256"):
            return f"{name} does not match its SHA-256 in the manifest"
    return None


def newest_intact_checkpoint(root: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies, and ``(folder, reason)`` for each newer one that does not."""
    skipped: list[tuple[Path, str]] = []
    for _, d in reversed(list_checkpoints(root)):
        why = verify_checkpoint(d)
        if why is None:
            return d, skipped
        skipped.append((d, why))
    return None, skipped


def load_checkpoint(d: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(model state dict, trainer state)`` of a verified checkpoint; tensors only, no pickle."""
    d = Path(d)
    why = verify_checkpoint(d)
    if why is not None:
        raise ValueError(f"checkpoint {str(d)!r} is not intact: {why}")
    weights: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        if f.name != STATE_TENSORS:
            weights.update(load_file(str(f)))
    if not weights:
        raise ValueError(f"checkpoint {str(d)!r} holds no model weights")
    meta = json.loads((d / STATE_JSON).read_text())
    state = decode_state(meta["state"], load_file(str(d / STATE_TENSORS)))
    return weights, state


# --------------------------------------------------------------------------- run folders


def _is_run_file(name: str) -> bool:
    """A name :data:`RUN_FILES` holds, or the temporary file of an interrupted write of one (``.config.json.x.tmp``)."""
    return name in RUN_FILES or (name.startswith(".") and name.endswith(".tmp") and name[1:].split(".tmp")[0].rsplit(".", 1)[0] in RUN_FILES)


def _is_train_config(p: Path) -> bool:
    """Whether ``p`` is a ``config.json`` slca train wrote (a mapping with the run's own fields)."""
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and {"run_dir", "steps", "estimator", "model"} <= set(d)


def _is_model_record(p: Path) -> bool:
    """Whether ``p`` is a ``model.json`` slca train wrote (exactly the fields :func:`write_model_record` writes)."""
    rec = read_model_record(p.parent) if p.name == MODEL_FILE else None
    return rec is not None and set(rec) == {"model", "fingerprint"}


class RunFolder:
    """An exclusively held run folder, checked against ``resume`` / ``overwrite``.

    Use as a context manager around a run (:func:`slca.training.trainer.train` does)::

        with RunFolder(cfg, resume=True) as run:
            ...  # run.checkpoint: the checkpoint to resume from, or None
    """

    def __init__(self, cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, defer_write: bool = False) -> None:
        if resume and overwrite:
            raise ConfigError("--overwrite", "--resume and --overwrite exclude each other")
        self.cfg, self.resume, self.overwrite = cfg, resume, overwrite
        self.path = Path(cfg.run_dir)
        self.checkpoint: Path | None = None
        self.notes: list[str] = []
        self.defer_write = defer_write
        self.committed = False
        self._fd: int | None = None
        self._created: Path | None = None  # the topmost folder this object made (removed again if the run never starts)

    # ------------------------------------------------------------------ lock

    def _lock(self) -> None:
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        self.path.mkdir(parents=True, exist_ok=True)
        self._created = missing[-1] if missing else None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no lock
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError("run_dir", f"{str(self.path)!r} is in use by another slca process") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def __enter__(self) -> "RunFolder":
        self.open()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None and not self.committed:
            self.discard()
        self.release()

    # ------------------------------------------------------------------ checks

    def holds_run(self) -> bool:
        return self.path.is_dir() and any((self.path / m).exists() for m in RUN_MARKERS)

    def open(self) -> "RunFolder":
        """Lock the folder and apply the resume / overwrite rules; then, unless ``defer_write``,
        :meth:`commit` (empty the folder for ``overwrite``, write config.json)."""
        self._lock()
        try:
            self._prepare()
            if not self.defer_write:
                self.commit()
        except BaseException:
            self.discard()
            self.release()
            raise
        return self

    def commit(self) -> None:
        """The run starts: with ``overwrite`` the old run is deleted; config.json is written.

        :func:`slca.training.trainer.train` commits once the tasks and the model have loaded, so a
        bad data file or a model that does not load leaves the folder as it was."""
        if self.overwrite and self.holds_run():
            self._clear()
        write_atomic(self.path / "config.json", json.dumps(to_dict(self.cfg), indent=2))
        self.committed = True

    def discard(self) -> None:
        """Remove the folders :meth:`open` made, when nothing was committed into them (a refused start)."""
        if self._created is None or self.committed:
            return
        for p in (self.path, *self.path.parents):
            if p == self.path:
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    p.rmdir()  # only while empty
                except OSError:
                    break
            if p == self._created:
                break
        self._created = None

    def _prepare(self) -> None:
        d = self.path
        if not self.holds_run():
            self._check_no_stray_run_files()
        if self.holds_run():
            if not (self.resume or self.overwrite):
                raise ConfigError("run_dir", f"{str(d)!r} already holds a run; pass --resume to continue it or --overwrite to replace it")
            if self.overwrite:
                self._check_clearable()
            else:
                self.checkpoint = self._resume_point()
        elif self.resume:
            self.notes.append(f"{d} holds no run yet; starting from step 0")

    def _check_clearable(self) -> None:
        d = self.path.resolve()
        cwd = Path.cwd().resolve()
        if d == cwd or d in cwd.parents or d == Path.home().resolve():
            raise ConfigError("run_dir", f"{str(self.path)!r} is the working folder, a folder above it or the home folder; --overwrite will not empty it")

    def _clear(self) -> None:
        """Delete the run's files (:data:`RUN_FILES`); anything else in the folder stays."""
        self._check_clearable()
        for p in self.path.resolve().iterdir():
            if _is_run_file(p.name):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

    def _check_no_stray_run_files(self) -> None:
        """A folder that holds no run may be trained into (the run's files written beside what is there) unless it
        holds a file of the name a run writes that no run wrote: it would be replaced (a project's ``config.json``, a
        ``report.md``). A ``config.json`` and a ``model.json`` slca wrote (a start that failed) are the run's own."""
        if not self.path.is_dir():
            return
        stray = []
        for p in sorted(self.path.iterdir()):
            if p.name not in RUN_FILES:
                continue
            if p.name == "config.json" and _is_train_config(p):
                continue
            if p.name == MODEL_FILE and _is_model_record(p):
                continue
            stray.append(p.name)
        if stray:
            raise ConfigError("run_dir", f"{str(self.path)!r} holds {', '.join(stray)}, which a run writes, but no run (no metrics.jsonl "
                              "or checkpoints): a run would replace them; choose another run_dir, or move them")

    def _stored_config(self) -> dict[str, Any] | None:
        p = self.path / "config.json"
        if not p.exists():
            return None
        return read_stored_config(p, "run_dir")

    def _resume_point(self) -> Path | None:
        stored = self._stored_config()
        if stored is not None:
            diff = config_diff(stored, self.cfg, ignore=("run_dir", *RESUME_MAY_CHANGE))
            if diff:
                raise ConfigError("--resume", f"the config differs from the run's config.json: {'; '.join(diff)} "
                                  f"(on resume only {', '.join(RESUME_MAY_CHANGE)} may change; for another config train a new "
                                  "run_dir, or pass --overwrite to delete this run and start over)")
            new = to_dict(self.cfg)
            defaults = to_dict(TrainConfig())
            for k in RESUME_MAY_CHANGE:
                if stored.get(k, defaults.get(k)) != new.get(k):  # said, as any change the run takes
                    self.notes.append(f"{k}: {stored.get(k, defaults.get(k))!r} -> {new.get(k)!r}")
        root = self.path / "checkpoints"
        if root.is_dir():
            _remove_leftovers(root)
        ckpt, skipped = newest_intact_checkpoint(root)
        if ckpt is None and skipped:
            reasons = "; ".join(f"{p.name}: {why}" for p, why in skipped)
            raise ConfigError("--resume", f"no intact checkpoint in {str(root)!r} ({reasons}); pass --overwrite to start over")
        for p, why in skipped:  # newer than the one resumed from: kept aside for inspection, never loaded
            aside = p.with_name(f"broken-{p.name}")
            shutil.rmtree(aside, ignore_errors=True)
            p.rename(aside)
            self.notes.append(f"skipped checkpoint {p.name} ({why}); moved to {aside.name}")
        if ckpt is None:
            self.notes.append(f"{self.path} has no checkpoint yet; starting from step 0")
        elif (_step_of(ckpt) or 0) > self.cfg.steps:
            raise ConfigError("steps", f"{self.cfg.steps} is below the step of the newest checkpoint ({ckpt.name}); a resumed run cannot shorten")
        return ckpt


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``; ``step`` is the 1-based index of the update
    (0: the evaluation before training). Runs written before slca counted steps that way
    (their first training record is step 0) are read with every step shifted by one."""
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        raise ValueError(f"{str(p)!r} does not exist: is {str(run_dir)!r} a run folder?")
    rows = read_jsonl(p)  # a torn last line (a run killed mid-write) is dropped; any other bad line is an error
    if any(r.get("step") == 0 and "loss" in r for r in rows):  # 0-based training steps: the old layout
        rows = [{**r, "step": r["step"] + 1} for r in rows]
    return rows
