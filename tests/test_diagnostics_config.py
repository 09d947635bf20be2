import math

import pytest
import torch

from slca import AdvantageInputs, segment_masks
from slca.core.diagnostics import contamination, grad_cosine, rolling_cv, summary_counterfactual
from slca.training.config import TrainConfig, apply_overrides, field_docs, load_config, validate


def _batch(summary):
    model = torch.tensor([[1, 1, 0, 1, 1]] * 4)
    tm, sm = segment_masks(model)
    return AdvantageInputs(torch.tensor([1.0, 0.0, 0.5, 0.2]), torch.tensor(summary), [0, 0, 1, 1], model, tm, sm)


def test_contamination_zero_under_slca_positive_under_grpo():
    inp = _batch([0.9, 0.1, 0.3, 0.8])  # summary rewards vary within groups
    assert contamination("slca", inp) == 0.0
    g = contamination("grpo", inp)
    assert 0.0 < g <= 1.0
    # gdpo normalises but does not lock: contaminated too
    assert contamination("gdpo", inp) > 0.0


def test_contamination_zero_for_grpo_when_summary_constant_in_group():
    inp = _batch([0.5, 0.5, 0.2, 0.2])
    assert contamination("grpo", inp) == pytest.approx(0.0, abs=1e-10)


def test_contamination_nan_without_tool_tokens():
    model = torch.ones(2, 3, dtype=torch.long)
    tm, sm = segment_masks(model)
    inp = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), [0, 0], model, tm, sm)
    assert math.isnan(contamination("grpo", inp))


def test_summary_counterfactual_keeps_nan_and_uses_group_means():
    inp = _batch([1.0, float("nan"), 0.2, 0.4])
    cf = summary_counterfactual(inp).summary_rewards
    assert cf[0] == pytest.approx(1.0) and math.isnan(cf[1]) and cf[2] == pytest.approx(0.3) and cf[3] == pytest.approx(0.3)


def test_grad_cosine_and_rolling_cv():
    assert grad_cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == 0.0
    assert grad_cosine(torch.tensor([1.0, 1.0]), torch.tensor([2.0, 2.0])) == pytest.approx(1.0)
    assert math.isnan(grad_cosine(torch.zeros(2), torch.ones(2)))
    assert rolling_cv([1.0, 3.0], 10) == pytest.approx(math.sqrt(2) / 2)
    assert rolling_cv([100.0, 1.0, 3.0], 2) == pytest.approx(math.sqrt(2) / 2)
    assert math.isnan(rolling_cv([1.0], 5))


def test_config_defaults_valid_and_every_field_documented():
    validate(TrainConfig())
    docs = field_docs()
    import dataclasses

    missing = [f.name for f in dataclasses.fields(TrainConfig) if not docs.get(f.name)]
    assert missing == []


@pytest.mark.parametrize(
    "override, match",
    [
        ("estimator=ppo", "estimator: unknown estimator 'ppo'; registered: \\['gdpo', 'grpo', 'rltr_planner', 'slca'"),
        ("group_size=1", "group_size: must be >= 2"),
        ("steps=0", "steps: must be > 0"),
        ("loss_agg=sum", "loss_agg: must be one of"),
        ("lr=fast", "lr: must be a number"),
        ("temperature=0", "temperature: must be > 0"),
        ("top_p=1.5", "top_p: must be in"),
        ("max_new_tokens=2000", "max_new_tokens: .* exceeds"),
        ("nonsense=1", "nonsense: unknown config field"),
        ("kl_coef=-1", "kl_coef: must be >= 0"),
    ],
)
def test_bad_config_refused_naming_field(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])


def test_config_file_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("estimator: grpo\nsteps: 3\nlr: 1e-3\n")
    cfg = load_config(p, ["steps=5"])
    assert cfg.estimator == "grpo" and cfg.steps == 5 and cfg.lr == 1e-3
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    cfg2 = apply_overrides(TrainConfig(), {"seed": 3})
    assert cfg2.seed == 3
