"""Files and folders with the modes a plain open / mkdir gives (slca._fs): the umask read, a temporary folder
that is not 0700, modes put right after writers that use 0600 / 0700."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest

from slca._fs import temp_dir, umask, umask_modes


@contextlib.contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_umask_reads_the_process_mask_without_changing_it(mask):
    with _umask(mask):
        assert umask() == mask
        assert umask() == mask  # still the same afterwards
        assert os.umask(mask) == mask


@pytest.mark.parametrize("mask,want", [(0o022, 0o755), (0o027, 0o750), (0o002, 0o775)])
def test_temp_dir_gets_the_mode_mkdir_would_give(tmp_path, mask, want):
    with _umask(mask):
        d = temp_dir(".tmp-ckpt-", tmp_path)
        plain = tmp_path / "plain"
        plain.mkdir()
    assert d.is_dir() and d.parent == tmp_path and d.name.startswith(".tmp-ckpt-")
    assert _mode(d) == want == _mode(plain)
    assert temp_dir(".tmp-ckpt-", str(tmp_path)) != d  # a new folder each time, str accepted


def test_umask_modes_puts_right_files_and_folders_and_leaves_links(tmp_path):
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    files = [root / "model.safetensors", root / "sub" / "config.json"]
    for f in files:
        f.write_text("x")
        os.chmod(f, 0o600)
    os.chmod(root / "sub", 0o700)
    os.chmod(root, 0o700)
    outside = tmp_path / "secret"
    outside.write_text("s")
    os.chmod(outside, 0o600)
    (root / "link").symlink_to(outside)
    with _umask(0o022):
        umask_modes(root)
    assert _mode(root) == _mode(root / "sub") == 0o755
    assert all(_mode(f) == 0o644 for f in files)
    assert _mode(outside) == 0o600  # a link is not followed
    with _umask(0o077):
        umask_modes(str(root))
    assert _mode(root) == 0o700 and _mode(files[0]) == 0o600
