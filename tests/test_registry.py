"""The estimator registry: complete specs, options refused or checked, one-registration estimators."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from slca.core.advantages import slca_advantages
from slca.core.registry import (
    AdvantageInputs,
    InputSpec,
    compute_advantages,
    fill_inputs,
    get_estimator,
    get_input,
    list_estimators,
    register_estimator,
    register_input,
)
from slca.core.segments import segment_masks

ROOT = Path(__file__).resolve().parents[1]


def _inputs():
    model = torch.tensor([[1, 0, 1], [1, 0, 1], [1, 1, 1]])
    tm, sm = segment_masks(model, torch.ones_like(model))
    return AdvantageInputs(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.0, 1.0, 0.2]), [0, 0, 0], model, tm, sm)


def test_builtin_specs_declare_their_options_and_inputs():
    slca = get_estimator("slca")
    assert slca.option_names == ("scale", "eps", "empty_tool", "empty_summary") and slca.needs == ()
    assert slca.defaults() == {"scale": "group", "eps": 1e-6, "empty_tool": "both", "empty_summary": "last_turn"}
    assert get_estimator("slca_cond").needs == ("tool_signatures",)
    assert "cond_std" in get_estimator("slca_cond").option_names
    assert get_estimator("slca_turn").needs == ("turn_rewards",)
    assert list_estimators(reference=True) == ["grpo", "slca", "gdpo"]
    assert {"tool_signatures", "turn_rewards"} <= {get_input(n).name for n in ("tool_signatures", "turn_rewards")}


@pytest.mark.parametrize(
    "name, kw, match",
    [
        ("slca", {"empty_tools": "include"}, "estimator 'slca' has no option 'empty_tools' \\(did you mean 'empty_tool'\\?\\); its options: \\['empty_summary', 'empty_tool', 'eps', 'scale'\\]"),
        ("grpo", {"scal": "batch"}, "estimator 'grpo' has no option 'scal'"),
        ("grpo", {"empty_tool": "include"}, "estimator 'grpo' has no option 'empty_tool'"),
        ("slca", {"empty_tool": "nope"}, "estimator 'slca': option 'empty_tool' must be one of"),
        ("slca", {"eps": "small"}, "estimator 'slca': option 'eps' must be float, got 'small'"),
        ("slca_turn", {"turn_lambda": True}, "estimator 'slca_turn': option 'turn_lambda' must be float"),
        ("slca_cond", {"cond_std": "x"}, "estimator 'slca_cond': option 'cond_std' must be one of"),
        ("slca_turn", {"turn_lambda": -0.5}, "estimator 'slca_turn': option 'turn_lambda' must be >= 0, got -0.5"),
        ("slca", {"eps": float("nan")}, "estimator 'slca': option 'eps' must be a finite number"),
    ],
)
def test_unknown_or_bad_options_are_refused(name, kw, match):
    inp = _inputs().with_inputs({"tool_signatures": ["a", "a", "b"], "turn_rewards": torch.zeros(3, 1)})
    with pytest.raises(ValueError, match=match):
        compute_advantages(name, inp, **kw)


def test_options_are_coerced_and_filled():
    inp = _inputs()
    assert torch.equal(compute_advantages("slca", inp, eps=0), slca_advantages(
        inp.tool_rewards, inp.summary_rewards, inp.group_ids, inp.tool_mask, inp.summary_mask, eps=0.0))
    spec = get_estimator("grpo")
    assert spec.pick({"scale": "none", "eps": 1e-3, "empty_tool": "include", "turn_lambda": 2.0}) == {"scale": "none", "eps": 1e-3}


def test_plain_functions_keep_working():
    def keyword_only(inputs, *, shift: float = 0.0):
        return inputs.model_mask.float() + shift

    register_estimator("test_keyword_only", keyword_only)
    assert get_estimator("test_keyword_only").option_names == ("shift",)
    assert float(compute_advantages("test_keyword_only", _inputs(), shift=1).max()) == 2.0
    with pytest.raises(ValueError, match="estimator 'test_keyword_only' has no option 'shfit'"):
        compute_advantages("test_keyword_only", _inputs(), shfit=1.0)

    def takes_anything(inputs, **kw):
        return inputs.model_mask.float() * len(kw)

    register_estimator("test_takes_anything", takes_anything)  # **kwargs declares no option: none reaches it unchecked
    assert get_estimator("test_takes_anything").option_names == ()
    assert float(compute_advantages("test_takes_anything", _inputs()).max()) == 0.0
    with pytest.raises(ValueError, match="estimator 'test_takes_anything' has no option 'a'; its options: \\[\\]"):
        compute_advantages("test_takes_anything", _inputs(), a=1, b=2)


def test_input_registry_guards():
    spec = InputSpec("test_input_x", "a thing", lambda trajs: [1] * len(trajs))
    assert register_input(spec) is spec and register_input(spec) is spec  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        register_input(InputSpec("test_input_x", "another thing"))
    with pytest.raises(ValueError, match="cannot compute AdvantageInputs field 'nope'"):
        get_input("nope")
    with pytest.raises(ValueError, match="no compute function"):
        InputSpec("test_input_y", "given by the caller").from_trajectories([])


def _doc_example() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Adding an estimator", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_worked_example_new_estimator_with_new_input_is_one_registration():
    ns: dict = {}
    exec(compile(_doc_example(), "docs/architecture.md", "exec"), ns)
    spec = get_estimator("slca_call_cost")
    assert spec.needs == ("n_calls",) and get_input("n_calls").doc.startswith("(B,) tool calls")
    inp = _inputs()
    with pytest.raises(ValueError, match="estimator 'slca_call_cost' needs AdvantageInputs.extra\\['n_calls'\\]"):
        compute_advantages("slca_call_cost", inp)

    class _T:  # what the trainer hands fill_inputs: its trajectories (only .calls is read here)
        def __init__(self, n):
            self.calls = [object()] * n

    filled = fill_inputs(inp, "slca_call_cost", [_T(0), _T(4), _T(1)])
    assert filled.get("n_calls").tolist() == [0.0, 4.0, 1.0]
    got = compute_advantages("slca_call_cost", filled, call_cost=0.1)
    want = slca_advantages(inp.tool_rewards - torch.tensor([0.0, 0.4, 0.1]), inp.summary_rewards, inp.group_ids, inp.tool_mask, inp.summary_mask)
    assert torch.allclose(got, want)
    with pytest.raises(ValueError, match="estimator 'slca_call_cost' has no option 'call_costs'"):
        compute_advantages("slca_call_cost", filled, call_costs=0.1)


@pytest.mark.slow
def test_worked_example_trains_through_the_cli(tmp_path):
    """`slca train --set estimator=slca_call_cost` after the one registration: the trainer fills n_calls."""
    from typer.testing import CliRunner

    from slca.cli import app
    from slca.env import toolworld
    from recipes.warmstart.config import ModelSize
    from recipes.warmstart.build import make_model
    from recipes.warmstart.tokenizer import train_tokenizer

    exec(compile(_doc_example(), "docs/architecture.md", "exec"), {})
    tasks = toolworld.make_tasks("train", n=20, seed=0)
    tok = train_tokenizer([m["content"] for t in tasks for m in t.messages] * 3, vocab_size=400)
    size = ModelSize(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64, max_position_embeddings=1024)
    d = tmp_path / "model"
    make_model(size, tok).save_pretrained(d)
    tok.save_pretrained(d)
    sets = ["estimator=slca_call_cost", f"model={d}", f"run_dir={tmp_path / 'run'}", "steps=1", "tasks_per_step=2", "group_size=2",
            "max_turns=1", "max_new_tokens=8", "minibatches=1", "eval_every=0", "eval_tasks=1", "save_every=0", "sample_html_every=0"]
    res = CliRunner().invoke(app, ["train"] + [x for s in sets for x in ("--set", s)])
    assert res.exit_code == 0, res.output
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert math.isfinite(row["loss"]) and row["step"] == 1  # 1-based: the update just taken


@pytest.mark.verl
def test_verl_adapter_uses_any_registered_estimator(monkeypatch):
    pytest.importorskip("verl")
    import numpy as np

    from slca.core.advantages import gdpo_advantages
    from slca.integrations.verl import compute_slca_outcome_advantage, pack_token_rewards

    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0], [1, 0, 0, 1, 1, 1]])
    rt, rs = torch.tensor([1.0, 0.0, 0.5, 0.25]), torch.tensor([0.0, 1.0, 0.2, 0.9])
    R = pack_token_rewards(rt, rs, mask, torch.tensor([6, 6, 4, 6]))
    index = np.array(["a", "a", "b", "b"], dtype=object)
    monkeypatch.setenv("SLCA_ESTIMATOR", "gdpo")
    adv, _ = compute_slca_outcome_advantage(R, mask, index=index)
    assert torch.allclose(adv, gdpo_advantages(rt, rs, ["a", "a", "b", "b"], mask), atol=1e-6)
    monkeypatch.setenv("SLCA_ESTIMATOR", "slca_cond")
    with pytest.raises(ValueError, match="SLCA_ESTIMATOR='slca_cond' needs \\['tool_signatures'\\]"):
        compute_slca_outcome_advantage(R, mask, index=index)
    sigs = np.empty(4, dtype=object)  # verl's non_tensor_batch: 1-D object arrays
    sigs[:] = [("x",), ("x",), ("y",), ("z",)]
    adv, _ = compute_slca_outcome_advantage(R, mask, index=index, non_tensor_batch={"tool_signatures": sigs})
    assert adv.shape == mask.shape and torch.isfinite(adv).all()
    monkeypatch.setenv("SLCA_ESTIMATOR", "nope")
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        compute_slca_outcome_advantage(R, mask, index=index)
