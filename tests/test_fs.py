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


# ---------------------------------------------------------------- failed writes, weights cut short, replaceable folders


def test_failed_writes_of_every_writer_are_one_line_naming_the_file(tmp_path):
    """Real failures past a file-size limit (RLIMIT_FSIZE in a child, SIGXFSZ ignored): Python's OSError, the safetensors
    writer's SafetensorError and the tokenizers library's bare Exception all become a WriteError naming the file."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import resource, signal, torch
        from safetensors.torch import save_file
        from tokenizers import Tokenizer, models
        from slca._fs import WriteError, writing
        d = {str(tmp_path)!r}
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        def text(p):
            with open(p, "w") as f:
                f.write("x" * 5000)
        writers = [
            ("text", text),
            ("weights", lambda p: save_file({{"w": torch.zeros(5000)}}, p)),
            ("tokenizer", lambda p: Tokenizer(models.WordLevel({{f"w{{i}}": i for i in range(500)}}, unk_token="w0")).save(p)),
        ]
        for name, write in writers:
            path = d + "/" + name
            try:
                with writing(path, "the " + name, after="nothing lost"):
                    write(path)
            except WriteError as e:
                print(name, type(e.__cause__).__name__, "|", e)
        try:
            with writing(d + "/bug"):
                raise KeyError("a bug is not a failed write")
        except KeyError:
            print("bug", "KeyError")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines == [
        f"text OSError | {tmp_path}/text: could not write the text (File too large, EFBIG); nothing lost",
        f"weights SafetensorError | {tmp_path}/weights: could not write the weights (File too large, EFBIG); nothing lost",
        f"tokenizer Exception | {tmp_path}/tokenizer: could not write the tokenizer (File too large, EFBIG); nothing lost",
        "bug KeyError",
    ], r.stdout


def test_check_weights_names_a_file_cut_short(tmp_path):
    import torch
    from safetensors.torch import save_file

    from slca._fs import check_weights

    save_file({"w": torch.zeros(100)}, str(tmp_path / "model.safetensors"))
    check_weights(tmp_path)  # whole: nothing to say
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-10])
    with pytest.raises(ValueError, match=rf"^{tmp_path}/model.safetensors: cut short or corrupt, not a whole safetensors file \("):
        check_weights(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")  # a garbled header
    with pytest.raises(ValueError, match="cut short or corrupt"):
        check_weights(tmp_path)


def test_a_build_replaces_only_an_empty_folder_or_a_model_slca_built(tmp_path):
    from slca._fs import replaceable_model_folder

    assert replaceable_model_folder(tmp_path / "new") is None
    (tmp_path / "empty").mkdir()
    assert replaceable_model_folder(tmp_path / "empty") is None
    built = tmp_path / "built"
    built.mkdir()
    for name in ("slca_build.json", "config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        (built / name).write_text("x")
    assert replaceable_model_folder(built) is None
    (built / "other").mkdir()  # another model, or anything, inside: not the build's
    assert "holds files that are not a model's: other/" in replaceable_model_folder(built)
    models = tmp_path / "models"
    models.mkdir()
    (models / "notes.txt").write_text("mine")
    assert replaceable_model_folder(models).startswith(f"'{models}' holds no model slca built (no slca_build.json): notes.txt; ")
    half = tmp_path / "half"  # a build interrupted while writing: model files, no record yet
    half.mkdir()
    (half / "config.json").write_text("{}")
    assert replaceable_model_folder(half) is not None and replaceable_model_folder(half, partial=True) is None
