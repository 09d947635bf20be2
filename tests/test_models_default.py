"""slca.models.default: where the embedded default model is loaded from, and loading it.

Cache entries and shipped-weight lookup on temporary folders (the recipe stubbed
where a test must show it is not needed, or stands in for a 40-minute build);
``load_default`` on the weights shipped in the package (seconds). The build
itself at a tiny size, and the shipped fingerprint against the recipe's:
tests/test_warmstart_build.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_warmstart_build import TINY

from recipes.warmstart import BuildConfig
from slca.models import default as dm
from slca.models import default_model_dir, resolve_default_dir, shipped_model_dir
from slca.models.tokenizer import chat_template


def _no_recipe(*_):
    raise AssertionError("the recipe was imported")


def _needs_shipped():
    if not (shipped_model_dir() / dm.INFO_FILE).exists():
        pytest.skip("no shipped weights in this tree")


def test_changed_config_gets_its_own_cache_entry(tmp_path, monkeypatch):
    a = default_model_dir(tmp_path, TINY)
    b = default_model_dir(tmp_path, BuildConfig(**{**TINY.__dict__, "vocab_size": 512}))
    assert a != b and a.parent == b.parent == tmp_path
    monkeypatch.setenv("SLCA_CACHE", str(tmp_path / "root"))
    assert default_model_dir(None, TINY).parent == tmp_path / "root" / "default-model"


def test_a_stale_shipped_fingerprint_is_not_loaded(tmp_path, monkeypatch):
    """A config that differs from the shipped one (TINY here) is built into the cache instead."""
    path, missing = resolve_default_dir(tmp_path, TINY)
    assert missing and path == default_model_dir(tmp_path, TINY)


def test_loading_the_default_needs_no_recipe(tmp_path, monkeypatch):
    """The shipped build is found from its own record: no recipe import, no fingerprint computed."""
    if not (shipped_model_dir() / "slca_build.json").exists():
        pytest.skip("no shipped weights in this tree")
    from slca.models import default as dm

    def no_recipe(*_):
        raise AssertionError("load_default() imported the recipe")

    monkeypatch.setattr(dm, "import_recipe", no_recipe)
    monkeypatch.setenv("SLCA_CACHE", str(tmp_path))
    assert resolve_default_dir() == (shipped_model_dir(), False)
    entry = default_model_dir()  # a cache entry of the shipped fingerprint (a rebuild) comes first
    entry.mkdir(parents=True)
    (entry / "slca_build.json").write_text("{}")
    assert resolve_default_dir() == (entry, False)



def test_the_cache_root_is_slca_cache_or_the_users_cache(monkeypatch):
    monkeypatch.setenv("SLCA_CACHE", "~/elsewhere")
    assert dm.default_cache_root() == Path.home() / "elsewhere"
    monkeypatch.delenv("SLCA_CACHE")
    assert dm.default_cache_root() == Path.home() / ".cache" / "slca"


def test_the_shipped_fingerprint_is_read_from_the_build_record_or_none(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    monkeypatch.setattr(dm, "shipped_model_dir", lambda: shipped)
    assert dm.shipped_fingerprint() is None  # no weights shipped
    shipped.mkdir()
    for unreadable in ("{not json", "[1, 2]"):
        (shipped / dm.INFO_FILE).write_text(unreadable)
        assert dm.shipped_fingerprint() is None
    (shipped / dm.INFO_FILE).write_text(json.dumps({"fingerprint": "0123abcd", "config": {}}))
    assert dm.shipped_fingerprint() == "0123abcd"


def test_without_a_config_the_shipped_fingerprint_names_the_entry_and_no_recipe_is_needed(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / dm.INFO_FILE).write_text(json.dumps({"fingerprint": "0123abcd"}))
    monkeypatch.setattr(dm, "shipped_model_dir", lambda: shipped)
    monkeypatch.setattr(dm, "import_recipe", _no_recipe)
    assert default_model_dir(tmp_path / "cache") == tmp_path / "cache" / "0123abcd"
    assert resolve_default_dir(tmp_path / "cache") == (shipped, False)  # the shipped weights, nothing to build
    (tmp_path / "cache" / "0123abcd").mkdir(parents=True)
    (tmp_path / "cache" / "0123abcd" / dm.INFO_FILE).write_text("{}")
    assert resolve_default_dir(tmp_path / "cache") == (tmp_path / "cache" / "0123abcd", False)  # a rebuilt entry first


def test_without_shipped_weights_the_recipe_names_the_entry_to_build(tmp_path, monkeypatch):
    asked = []
    recipe = SimpleNamespace(BuildConfig=lambda: "the-default", fingerprint=lambda cfg: asked.append(cfg) or f"fp-{cfg}")
    monkeypatch.setattr(dm, "shipped_model_dir", lambda: tmp_path / "none")
    monkeypatch.setattr(dm, "import_recipe", lambda: recipe)
    assert resolve_default_dir(tmp_path) == (tmp_path / "fp-the-default", True)
    assert resolve_default_dir(tmp_path, config="other") == (tmp_path / "fp-other", True)
    assert asked == ["the-default", "other"]


def test_add_response_template_only_to_the_projects_template():
    mine = SimpleNamespace(chat_template=chat_template(), response_template=None)
    assert dm.add_response_template(mine) is mine
    assert mine.response_template == dm.RESPONSE_TEMPLATE and mine.response_template is not dm.RESPONSE_TEMPLATE  # a copy
    mine.response_template["fields"].clear()
    assert dm.RESPONSE_TEMPLATE["fields"]  # the module's template is untouched
    other = SimpleNamespace(chat_template="{{ messages }}", response_template=None)
    assert dm.add_response_template(other).response_template is None  # another template: unchanged
    own = {"fields": {}}
    kept = SimpleNamespace(chat_template=chat_template(), response_template=own)
    assert dm.add_response_template(kept).response_template is own  # one already set: kept


def test_load_default_gives_the_shipped_model_and_a_tokenizer_that_parses_its_turns(tmp_path, monkeypatch):
    """The shipped build in eval mode, float32, without the recipe; its tokenizer parses a generated turn
    (reasoning, text, parallel hermes calls) into a message, as TRL's tool loop reads it."""
    _needs_shipped()
    from transformers import Qwen2ForCausalLM

    monkeypatch.setenv("SLCA_CACHE", str(tmp_path))
    monkeypatch.setattr(dm, "import_recipe", _no_recipe)
    model, tok = dm.load_default()
    assert isinstance(model, Qwen2ForCausalLM) and not model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config.vocab_size == len(tok) and tok.chat_template == chat_template()
    assert tok.response_template == dm.RESPONSE_TEMPLATE
    text = ('<think>\nPlan.\n</think>\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>')
    msg = tok.parse_response(tok(text, add_special_tokens=False)["input_ids"], prefix="<|im_start|>assistant\n")
    assert msg["role"] == "assistant" and msg["reasoning_content"] == "Plan." and msg["content"] == "Checking."
    assert [c["function"] for c in msg["tool_calls"]] == [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                          {"name": "get_time", "arguments": {}}]
    plain = tok.parse_response(tok("Hello.<|im_end|>", add_special_tokens=False)["input_ids"], prefix="<|im_start|>assistant\n")
    assert plain == {"role": "assistant", "content": "Hello."}


def test_load_default_builds_another_config_once_and_again_on_rebuild(tmp_path, monkeypatch):
    """Another config is built into its cache entry on first use and loaded from it after; ``rebuild=True``
    removes the entry and builds again. The recipe is a stand-in that copies the shipped folder (a real
    build: tests/test_warmstart_build.py)."""
    _needs_shipped()
    built = []

    def build_default(path, config, progress=True):
        built.append((Path(path).name, config, progress))
        shutil.copytree(shipped_model_dir(), path)

    recipe = SimpleNamespace(BuildConfig=lambda: "the-default", fingerprint=lambda cfg: f"fp-{cfg}", build_default=build_default)
    monkeypatch.setattr(dm, "import_recipe", lambda: recipe)
    model, tok = dm.load_default(tmp_path, config="other", progress=False)
    assert built == [("fp-other", "other", False)] and tok.response_template == dm.RESPONSE_TEMPLATE
    (tmp_path / "fp-other" / "stale.jinja").write_text("")  # a leftover of the build: the rebuild removes it
    dm.load_default(tmp_path, config="other", progress=False)
    assert len(built) == 1  # loaded from the cache entry
    (tmp_path / "fp-other" / "notes.md").write_text("mine")  # a file no build writes: the rebuild refuses, deletes nothing
    with pytest.raises(ValueError, match=r"rebuild: .*fp-other' holds files that are not a model's: notes.md"):
        dm.load_default(tmp_path, config="other", progress=False, rebuild=True)
    assert len(built) == 1 and (tmp_path / "fp-other" / "notes.md").read_text() == "mine"
    (tmp_path / "fp-other" / "notes.md").unlink()
    dm.load_default(tmp_path, config="other", progress=False, rebuild=True)
    assert built[1:] == [("fp-other", "other", False)] and not (tmp_path / "fp-other" / "stale.jinja").exists()
