"""recipes/warmstart/config.py: the default model's build configuration refuses what cannot be built.

The architecture's head counts must divide, every demonstration flaw rate is a probability, and the build's
entity style and paraphrase fraction are checked when the config is made (before any data is generated). How
the config names a build (build.py's fingerprint): tests/test_warmstart_{build,sft,paraphrase}.py.
"""

from __future__ import annotations

import pytest

from recipes.warmstart.config import BuildConfig, DemoMix, ModelSize


def test_model_size_must_divide_heads():
    with pytest.raises(ValueError, match="num_attention_heads"):
        ModelSize(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ModelSize(num_attention_heads=6, num_key_value_heads=4)


def test_mix_rejects_bad_probabilities():
    with pytest.raises(ValueError, match="DemoMix.verbose"):
        DemoMix(verbose=1.5)


def test_build_config_checks_the_new_fields():
    with pytest.raises(ValueError, match="entity_style"):
        BuildConfig(entity_style="runic")
    with pytest.raises(ValueError, match="paraphrase"):
        BuildConfig(paraphrase=1.5)
