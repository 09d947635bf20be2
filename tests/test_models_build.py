"""The whole default-model pipeline at a tiny size: toolworld demos -> tokenizer ->
Qwen2 -> SFT -> save_pretrained -> AutoModelForCausalLM, and the build cache."""

from __future__ import annotations

import json

import pytest
import torch

from slca.models import BuildConfig, ModelSize, SFTConfig, default_model_dir, load_default

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


def test_changed_config_gets_its_own_cache_entry(tmp_path, monkeypatch):
    a = default_model_dir(tmp_path, TINY)
    b = default_model_dir(tmp_path, BuildConfig(**{**TINY.__dict__, "vocab_size": 512}))
    assert a != b and a.parent == b.parent == tmp_path
    monkeypatch.setenv("SLCA_CACHE", str(tmp_path / "root"))
    assert default_model_dir(None, TINY).parent == tmp_path / "root" / "default-model"


def test_model_size_must_divide_heads():
    with pytest.raises(ValueError, match="num_attention_heads"):
        ModelSize(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ModelSize(num_attention_heads=6, num_key_value_heads=4)


def test_shipped_weights_if_any_are_the_current_recipe(tmp_path, monkeypatch):
    """Weights shipped in the package were built by the current recipe (rebuild: `slca build-model --out
    src/slca/models/shipped`); with none shipped, the default is built into the cache on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    from slca.models import BuildConfig, resolve_default_dir, shipped_model_dir

    shipped = shipped_model_dir()
    monkeypatch.setenv("SLCA_CACHE", str(tmp_path))  # an empty cache
    expected = default_model_dir(None, BuildConfig()).name
    if not (shipped / "slca_build.json").exists():
        assert resolve_default_dir() == (default_model_dir(None, BuildConfig()), True)
        return
    info = json.loads((shipped / "slca_build.json").read_text())
    assert info["fingerprint"] == expected, "recipe changed: rebuild with `slca build-model --out src/slca/models/shipped`"
    assert BuildConfig.from_dict(info["config"]) == BuildConfig()
    weights = shipped / "model.safetensors"
    assert weights.stat().st_size <= 16 * 2**20
    assert resolve_default_dir() == (shipped, False)  # loaded from the package, nothing to build
    model = AutoModelForCausalLM.from_pretrained(shipped)
    assert isinstance(model, Qwen2ForCausalLM)
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(shipped))
    assert len(info["losses"]) == BuildConfig().sft.steps


def test_a_stale_shipped_fingerprint_is_not_loaded(tmp_path, monkeypatch):
    """A config that differs from the shipped one (TINY here) is built into the cache instead."""
    from slca.models import resolve_default_dir

    path, missing = resolve_default_dir(tmp_path, TINY)
    assert missing and path == default_model_dir(tmp_path, TINY)


def test_fingerprint_follows_generated_data_not_source_bytes():
    """The cache key is what decides the weights (config, recipe version, chat template, the generated data), so a
    change to what toolworld generates names a new model, and an edit that generates the same data (a comment) does not."""
    import dataclasses

    from slca.env import toolworld
    from slca.models import default as dm

    cfg = BuildConfig()
    dm._data_digest.cache_clear()
    before = dm._data_digest(cfg)
    dm._data_digest.cache_clear()
    assert dm._data_digest(cfg) == before  # deterministic
    weather = toolworld._TYPES[0]
    changed = dataclasses.replace(weather, templates=tuple(t.replace("weather", "forecast") for t in weather.templates))
    toolworld._TYPES[0] = changed
    dm._data_digest.cache_clear()
    try:
        assert dm._data_digest(cfg) != before
    finally:
        toolworld._TYPES[0] = weather
        dm._data_digest.cache_clear()
