"""Files and folders with the modes a plain ``open`` / ``mkdir`` gives: the umask read, a temporary folder
that can be renamed into place, modes put right after writers that use 0600 / 0700 (safetensors, mkdtemp);
failed writes as one :class:`WriteError` naming the file (whichever writer failed: Python's ``open``, the
safetensors writer, the tokenizers library); weight files checked before they load (:func:`check_weights`);
which folders a command may replace (:func:`replaceable_model_folder`).

The lowest layer: run folders (:mod:`slca.training.runs`), model folders (:mod:`slca.models`) and the warm-start
recipe's build all write through it.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from safetensors import safe_open

__all__ = ["umask", "temp_dir", "umask_modes", "WriteError", "write_error", "writing", "check_weights", "replaceable_model_folder",
           "MODEL_INFO_FILE"]


def umask() -> int:
    """The process's file-mode creation mask (read without changing it where Linux allows)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but only for a moment)
    os.umask(mask)
    return mask


def temp_dir(prefix: str, dir: str | Path) -> Path:
    """``tempfile.mkdtemp`` with the mode ``mkdir`` would give (``0o777`` less the umask), not 0700:
    a folder renamed into place (a checkpoint, a built model) is readable as any other output."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
    os.chmod(d, 0o777 & ~umask())
    return d


def umask_modes(root: str | Path) -> None:
    """Give every file and folder under ``root`` (``root`` included) the mode a plain ``open`` /
    ``mkdir`` gives under the umask: safetensors writes its files 0600, mkdtemp its folder 0700."""
    mask = umask()
    root = Path(root)
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


# --------------------------------------------------------------------------- failed writes


class WriteError(OSError):
    """A write that failed (disk full, a file too large, a folder not writable): ``str()`` is one line that names the
    file and what the system said; ``errno`` is the system's."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


_OS_ERROR = re.compile(r"os error (\d+)")


def _reason(e: BaseException) -> tuple[int | None, str] | None:
    """``(errno, what the system said)`` of a failed write, whichever library raised it; None for an error that is
    not one (a bug keeps its traceback)."""
    if isinstance(e, WriteError):
        return e.errno, e.message
    if isinstance(e, OSError):
        return e.errno, e.strerror or str(e)
    # the safetensors writer raises SafetensorError ("Error while serializing: I/O error: File too large (os error 27)"),
    # the tokenizers library a bare Exception ("File too large (os error 27)"): the system's error is in the text
    if type(e).__name__ == "SafetensorError" or type(e) is Exception:
        m = _OS_ERROR.search(str(e))
        if m:
            code = int(m.group(1))
            return code, os.strerror(code)
        if type(e).__name__ == "SafetensorError" and "serializ" in str(e).lower():
            return None, " ".join(str(e).split())
    return None


def write_error(path: str | Path, e: BaseException, what: str = "", *, after: str = "", named: bool = True) -> WriteError | None:
    """The :class:`WriteError` of ``e`` raised while writing ``path``, or None when ``e`` is not a failed write:
    ``<path>: could not write <what> (<reason>, <ERRNO>)<; after>``. With ``named``, the file the system named (an
    ``OSError``'s ``filename``) wins over ``path``; without, ``path`` is named (the system's file is a temporary one)."""
    if isinstance(e, WriteError):
        return e
    why = _reason(e)
    if why is None:
        return None
    code, text = why
    where = (getattr(e, "filename", None) if named else None) or path
    name = _errno.errorcode.get(code, "") if code else ""
    return WriteError(code, f"{where}: could not write{' ' + what if what else ''} ({text}{', ' + name if name else ''})"
                            + (f"; {after}" if after else ""))


@contextlib.contextmanager
def writing(path: str | Path, what: str = "", *, after: str = "", named: bool = True) -> Iterator[None]:
    """Within the block, a failed write becomes a :class:`WriteError` naming ``path`` (see :func:`write_error`)."""
    try:
        yield
    except Exception as e:
        err = write_error(path, e, what, after=after, named=named)
        if err is None:
            raise
        raise err from e


def fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename (never a torn file).

    The file gets the mode ``open`` would give it (``0o666`` less the umask), not the
    temporary file's 0600."""
    path = Path(path)
    with writing(path, named=False):  # a failed write names the file, not its temporary twin; the old file is intact
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~umask())
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    fsync_dir(path.parent)


# --------------------------------------------------------------------------- weights that load


def check_weights(folder: str | Path) -> None:
    """Refuse, naming the file, a ``*.safetensors`` file of ``folder`` that is cut short or not a safetensors file (an
    interrupted copy or download): its header is read and checked against the file's size, no tensor is loaded.

    Raises:
        ValueError: ``<file>: cut short or corrupt (<what safetensors says>)``.
    """
    for f in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                st.keys()
        except Exception as e:  # SafetensorError for a short or garbled header; OSError for an unreadable file
            if isinstance(e, OSError):
                raise ValueError(f"{f}: could not read ({e.strerror or e})") from None
            raise ValueError(f"{f}: cut short or corrupt, not a whole safetensors file ({' '.join(str(e).split())}); "
                             "copy or download it again") from None


# --------------------------------------------------------------------------- folders a command may replace


MODEL_INFO_FILE = "slca_build.json"
"""The record a built model folder holds (the recipe's ``INFO_FILE``): a folder with it is a model slca built."""

_MODEL_SUFFIXES = (".json", ".safetensors", ".jinja", ".model")
_MODEL_NAMES = ("merges.txt", "vocab.txt")


def replaceable_model_folder(out: str | Path, *, partial: bool = False) -> str | None:
    """None if a model build may replace ``out``: it does not exist, is empty, or is a model folder slca built (its
    ``slca_build.json`` and the files of a ``save_pretrained`` folder, nothing else; with ``partial``, the record may be
    missing: a build interrupted while writing); otherwise why not, in one line."""
    out = Path(out)
    if not out.exists():
        return None
    if not out.is_dir():
        return f"{str(out)!r} exists and is not a folder"
    entries = sorted(out.iterdir())
    if not entries:
        return None
    def name(p: Path) -> str:
        return p.name + ("/" if p.is_dir() else "")

    built = (out / MODEL_INFO_FILE).is_file()
    other = [name(p) for p in entries if p.is_dir() or not (p.name.endswith(_MODEL_SUFFIXES) or p.name in _MODEL_NAMES)]
    if (built or partial) and not other:
        return None
    shown = other if built else [name(p) for p in entries]
    listed = ", ".join(shown[:5]) + (", ..." if len(shown) > 5 else "")
    why = "files that are not a model's" if built else "no model slca built (no slca_build.json)"
    return (f"{str(out)!r} holds {why}: {listed}; a build replaces only an empty folder or a model folder slca built: "
            f"choose a new folder, e.g. {str(out / 'default')!r}")
