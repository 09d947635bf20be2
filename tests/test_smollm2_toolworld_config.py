"""recipes/smollm2_toolworld/config.py: the stage-1 recipe's one config (issue 42).

Its rules keep ``train_heldout`` unseen by the demonstrations (``n_tasks`` no more than the train requests it
leaves out, data seed 0), it takes ``key=value`` overrides (nested ``mix.*``, tuples from commas) and round-trips
through a dict, and its docstring states the selection rule. The rest of the recipe:
tests/test_smollm2_toolworld_{sft,build,evaluate}.py.
"""

from __future__ import annotations

import pytest

from recipes.smollm2_toolworld import Stage1Config, apply_overrides
from slca.env import toolworld


def test_the_config_keeps_train_heldout_unseen_and_takes_overrides():
    with pytest.raises(ValueError, match="n_tasks"):
        Stage1Config(n_tasks=toolworld.WARMSTART_DEMOS[0] + 1)
    with pytest.raises(ValueError, match="data_seed"):
        Stage1Config(data_seed=1)
    cfg = apply_overrides(Stage1Config(), ["steps=7", "lr=5e-4", "mix.verbose=0", "lora_target_modules=q_proj,v_proj"])
    assert (cfg.steps, cfg.lr, cfg.mix.verbose, cfg.lora_target_modules) == (7, 5e-4, 0.0, ("q_proj", "v_proj"))
    assert Stage1Config.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="not a field"):
        apply_overrides(cfg, ["learning_rate=1"])
    from recipes.smollm2_toolworld import config

    assert "may only ever be chosen by tool-task success on\n``train_heldout``" in config.__doc__  # the selection rule

