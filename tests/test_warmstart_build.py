"""The whole default-model pipeline at a tiny size: toolworld demos -> tokenizer ->
Qwen2 -> SFT -> save_pretrained -> AutoModelForCausalLM, the build cache, the shipped
weights and the fingerprint that names them (recipes/warmstart builds, slca.models loads). Where the default
is looked up (cache entries, shipped weights): tests/test_models_default.py; finding the recipe:
tests/test_models_recipe.py."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipes.warmstart import BuildConfig, ModelSize, SFTConfig, build, fingerprint, make_demonstrations
from slca.env import toolworld
from slca.models import default_model_dir, load_default, resolve_default_dir, shipped_model_dir

ROOT = Path(__file__).resolve().parents[1]

TINY = BuildConfig(
    n_tasks=80,
    vocab_size=400,
    model=ModelSize(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64),
    sft=SFTConfig(steps=25, batch_tokens=4096, lr=1e-2, warmup_steps=3),
)


@pytest.mark.slow
def test_tiny_build_trains_caches_and_loads_with_auto_classes(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    model, tok = load_default(tmp_path, config=TINY, progress=False)
    path = default_model_dir(tmp_path, TINY)
    info = json.loads((path / "slca_build.json").read_text())
    losses = info["losses"]
    assert len(losses) == 25
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert info["config"] == TINY.to_dict() and BuildConfig.from_dict(info["config"]) == TINY

    # Plain transformers loads the cache entry (so vLLM can too).
    again = AutoModelForCausalLM.from_pretrained(path)
    assert isinstance(again, Qwen2ForCausalLM) and again.config.tie_word_embeddings
    assert AutoTokenizer.from_pretrained(path).chat_template == tok.chat_template
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    assert len(tok) == 400 and model.config.vocab_size == 400
    assert model.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")

    # Generation stops at <|im_end|> through the saved generation config.
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi, I am Anna."}], add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]

    # Second call: loaded from the cache, not rebuilt.
    stamp = (path / "slca_build.json").stat().st_mtime_ns
    load_default(tmp_path, config=TINY, progress=False)
    assert (path / "slca_build.json").stat().st_mtime_ns == stamp
    # rebuild=True builds again (same config, same seeds -> same weights).
    rebuilt, _ = load_default(tmp_path, config=TINY, progress=False, rebuild=True)
    assert (path / "slca_build.json").stat().st_mtime_ns != stamp
    for a, b in zip(model.state_dict().values(), rebuilt.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5)


def test_shipped_weights_if_any_are_the_current_recipe(tmp_path, monkeypatch):
    """Weights shipped in the package were built by the current recipe (rebuild: `slca build-model --out
    src/slca/models/shipped`); with none shipped, the default is built into the cache on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    shipped = shipped_model_dir()
    monkeypatch.setenv("SLCA_CACHE", str(tmp_path))  # an empty cache
    expected = fingerprint(BuildConfig())
    if not (shipped / "slca_build.json").exists():
        assert resolve_default_dir() == (tmp_path / "default-model" / expected, True)
        return
    info = json.loads((shipped / "slca_build.json").read_text())
    assert BuildConfig.from_dict(info["config"]) == BuildConfig(), "the default BuildConfig changed: rebuild the shipped weights"
    assert info["data"]["sample"] == build.data_digest(BuildConfig()), (
        "the recipe generates other data (toolworld, demonstrations, entity synthesis, drills or chat template changed): "
        "rebuild with `slca build-model --out src/slca/models/shipped`")
    assert info["fingerprint"] == expected, "recipe changed: rebuild with `slca build-model --out src/slca/models/shipped`"
    weights = shipped / "model.safetensors"
    assert weights.stat().st_size <= 16 * 2**20
    assert resolve_default_dir() == (shipped, False)  # loaded from the package, nothing to build
    assert resolve_default_dir(config=BuildConfig()) == (shipped, False)  # the recipe's default config names the same build
    model = AutoModelForCausalLM.from_pretrained(shipped)
    assert isinstance(model, Qwen2ForCausalLM)
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(shipped))
    assert len(info["losses"]) == BuildConfig().sft.steps


def _edited_copy(dest: Path) -> Path:
    """A copy of src/slca and recipes/ whose toolworld and recipe modules carry an edited docstring and a new comment."""
    shutil.copytree(ROOT / "src" / "slca", dest / "src" / "slca", ignore=shutil.ignore_patterns("shipped", "__pycache__"))
    shutil.copytree(ROOT / "recipes", dest / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    edited = [dest / "src" / "slca" / "env" / "toolworld.py", *sorted((dest / "recipes" / "warmstart").glob("*.py"))]
    for path in edited:
        text = path.read_text()
        head = text.index('"""') + 3
        path.write_text(text[:head] + "Edited docstring. " + text[head:] + "\n# a comment added at the end\n")
    return dest


def test_fingerprint_follows_generated_data_and_config_not_source_bytes(tmp_path):
    """The fingerprint is what decides the weights (config, recipe version, the generated demonstrations and tokenizer
    text, the drills): a docstring or comment edit to toolworld or the recipe keeps it; a change to what toolworld
    generates, or to the build config, names a new model."""
    cfg = BuildConfig()
    build._data_digest.cache_clear()
    before = fingerprint(cfg)
    build._data_digest.cache_clear()
    assert fingerprint(cfg) == before  # deterministic

    tree = _edited_copy(tmp_path / "edited")
    code = ("import slca, recipes.warmstart as w; assert slca.__file__.startswith(%r), slca.__file__; "
            "print(w.fingerprint(w.BuildConfig()))" % str(tree))
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(tree / "src")}).stdout.split()
    assert out == [before]  # a docstring and a comment in toolworld and in every recipe module: the same build

    assert fingerprint(dataclasses.replace(cfg, vocab_size=cfg.vocab_size + 1)) != before  # the build config
    weather = toolworld._TYPES[0]
    toolworld._TYPES[0] = dataclasses.replace(weather, templates=tuple(t.replace("weather", "forecast") for t in weather.templates))
    build._data_digest.cache_clear()
    try:
        assert fingerprint(cfg) != before  # the generated demonstrations (and the tokenizer text rendered from them)
    finally:
        toolworld._TYPES[0] = weather
        build._data_digest.cache_clear()


@pytest.mark.slow
def test_the_recipe_still_generates_the_shipped_models_demonstrations():
    """All the demonstrations the shipped weights were trained on, and the tokenizer text rendered from them, are
    what the recipe generates now (12,000 demonstrations, ~50 CPU s): the shipped build is the recipe's."""
    info = json.loads((shipped_model_dir() / "slca_build.json").read_text())
    if "demonstrations" not in info.get("data", {}):
        pytest.skip("the shipped build records no digest of its demonstrations")
    cfg = BuildConfig.from_dict(info["config"])
    demos = build.build_demonstrations(cfg)
    assert build.demonstrations_digest(demos) == info["data"]["demonstrations"]


@pytest.mark.slow
def test_a_build_stopped_midway_resumes_to_the_weights_of_one_go(tmp_path):
    """build_default with a state_dir: stopped after a checkpoint, run again, it continues there and gives
    the weights, losses and induction losses of the build made in one go (same machine, same threads)."""
    from safetensors.torch import load_file

    cfg = dataclasses.replace(TINY, sft=dataclasses.replace(TINY.sft, steps=12, induction_steps=3, induction_every=4))
    build.build_default(tmp_path / "whole", cfg, progress=False)

    class Stop(Exception):
        pass

    def stop_at_8(step, loss, model, tokenizer):
        if step == 8:
            raise Stop

    state = tmp_path / "state"
    with pytest.raises(Stop):
        build.build_default(tmp_path / "part", cfg, progress=False, on_step=stop_at_8, state_dir=state, checkpoint_every=5)
    saved = build.read_build_state(state, cfg)
    assert saved["step"] == 5 and len(saved["stats"]["losses"]) == 5 and not (tmp_path / "part").exists()
    other = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, lr=cfg.sft.lr / 2))
    with pytest.raises(ValueError, match="another config"):
        build.build_default(tmp_path / "other", other, progress=False, state_dir=state)  # refused, and the state is kept
    rep = build.build_default(tmp_path / "part", cfg, progress=False, state_dir=state, checkpoint_every=5)
    assert rep.resumed_from == 5 and not state.exists()
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "part" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    info_a, info_b = (json.loads((tmp_path / d / "slca_build.json").read_text()) for d in ("whole", "part"))
    assert info_a["losses"] == info_b["losses"] and len(info_b["losses"]) == 12
    assert info_a["induction_losses"] == info_b["induction_losses"] and len(info_b["induction_losses"]) == 3
    assert info_a["fingerprint"] == info_b["fingerprint"] and info_b["report"]["resumed_from"] == 5


def test_build_model_refuses_a_negative_checkpoint_interval(tmp_path):
    from typer.testing import CliRunner

    from slca.cli import app

    r = CliRunner().invoke(app, ["build-model", "--out", str(tmp_path / "m"), "--checkpoint-every", "-1"])
    assert r.exit_code == 2 and "--checkpoint-every" in r.output


def test_build_model_refuses_a_folder_that_is_not_a_model_it_built(tmp_path):
    from typer.testing import CliRunner

    from slca.cli import app

    models = tmp_path / "models"
    (models / "other-model").mkdir(parents=True)
    (models / "other-model" / "model.safetensors").write_bytes(b"weights")
    (models / "notes.txt").write_text("mine")
    r = CliRunner().invoke(app, ["build-model", "--out", str(models)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: --out: '{models}' holds no model slca built (no slca_build.json): notes.txt, other-model/; "), r.stderr
    assert sorted(p.name for p in models.iterdir()) == ["notes.txt", "other-model"]  # nothing deleted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]  # nothing built beside it either


def test_build_model_replaces_an_earlier_build_and_leaves_nothing_beside_it(tmp_path, monkeypatch):
    """The 40-minute build itself is stood in for (it writes a small model folder); what is checked is the replacement."""
    import types

    from typer.testing import CliRunner

    import recipes.warmstart as warmstart
    from slca.cli import app

    def fake_build(out, cfg, **kw):
        out.mkdir()
        (out / "slca_build.json").write_text('{"fingerprint": "new"}')
        (out / "model.safetensors").write_bytes(b"new weights")
        return types.SimpleNamespace(n_params=1e6, total_seconds=1.0, total_cpu_seconds=1.0, resumed_from=0)

    monkeypatch.setattr(warmstart, "build_default", fake_build)
    out = tmp_path / "default"
    out.mkdir()
    (out / "slca_build.json").write_text('{"fingerprint": "old"}')
    (out / "config.json").write_text("{}")
    r = CliRunner().invoke(app, ["build-model", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "slca_build.json"]
    assert json.loads((out / "slca_build.json").read_text()) == {"fingerprint": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default"]  # no .default.build, .default.old-*, .default.build-state
