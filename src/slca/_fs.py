"""Files and folders with the modes a plain ``open`` / ``mkdir`` gives: the umask read, a temporary folder
that can be renamed into place, modes put right after writers that use 0600 / 0700 (safetensors, mkdtemp).

The lowest layer: run folders (:mod:`slca.training.runs`), model folders (:mod:`slca.models`) and the warm-start
recipe's build all write through it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["umask", "temp_dir", "umask_modes"]


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
