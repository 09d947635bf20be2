"""Issue 44: a TRL user's first hour, each point as the user met it.

A command the user ran is run as a real process (the example script, ``slca eval``, ``slca train``,
``make``); what the user wrote in Python is called directly. The policy of the trainer tests is
tests/test_integration_trl.py's hand-set bigram model, or a scripted ``rollout_func`` (no generation).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from test_integration_trl import (  # noqa: E402
    ANSWER,
    base_args,
    build_policy,
    build_tokenizer,
    dataset,
    execution_reward,
    group_norm,
    scripted_rollout_func,
    summary_reward,
)

from slca import metrics as M  # noqa: E402
from slca.integrations.trl import SLCAGRPOTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "trl" / "train_slca_trl.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
SMALL_RUN = ["--output_dir", "OUT", "--use_cpu", "--bf16", "false", "--max_steps", "1", "--report_to", "none"]


def last_line(text: str) -> str:
    return [ln for ln in text.splitlines() if ln.strip()][-1]


def run_example(tmp_path, args: list[str], block: str | None = None) -> subprocess.CompletedProcess:
    """The example as a user runs it; ``block``: a package made missing for this process (``sys.modules[name] = None``)."""
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    if block is None:
        cmd = [sys.executable, EXAMPLE, *argv]
    else:
        boot = (f"import runpy, sys; sys.modules[{block!r}] = None; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        cmd = [sys.executable, "-c", boot, EXAMPLE, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)


# ---------------------------------------------------------------- 1. named models in the trainer, hub ids that cannot load


def test_a_named_model_loads_offline_in_the_trainer(tmp_path):
    """``SLCAGRPOTrainer(model="default")`` went to the hub; it is slca's embedded model, with its tokenizer."""
    from slca.models.named import load_named

    t = SLCAGRPOTrainer(model="default", reward_funcs=[execution_reward, summary_reward], args=base_args(tmp_path),
                        train_dataset=dataset(8))
    model, tok = load_named("default")
    assert type(t.model) is type(model) and all(torch.equal(a, b) for a, b in zip(t.model.state_dict().values(),
                                                                                  model.state_dict().values()))
    assert t.processing_class.chat_template == tok.chat_template  # slca's template: TRL's tool loop parses it


def test_a_hub_id_that_cannot_load_fails_at_once_in_one_line_naming_the_named_models(tmp_path):
    with pytest.raises(ValueError) as e:
        SLCAGRPOTrainer(model="nobody/no-such-model", reward_funcs=[execution_reward, summary_reward],
                        args=base_args(tmp_path), train_dataset=dataset(8))
    msg = str(e.value)
    assert msg.startswith("model 'nobody/no-such-model': ") and "HF_HUB_OFFLINE=1" in msg and "\n" not in msg
    assert "named models load offline: 'default' (" in msg and "'smollm2' (" in msg


@pytest.mark.slow
def test_the_example_refuses_an_unreachable_hub_id_in_one_line(tmp_path):
    r = run_example(tmp_path, ["--model", "nobody/no-such-model", *SMALL_RUN])
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert last_line(r.stderr).startswith("--model 'nobody/no-such-model': not a local folder"), r.stderr[-2000:]
    assert "'smollm2'" in last_line(r.stderr)


# ---------------------------------------------------------------- 2. the split visible in TRL


def test_the_last_batch_split_is_kept_and_drawn_as_the_token_page(tmp_path):
    """The (B, T) advantages, segment masks and token ids of the last batch; the metrics of segments missing;
    ``write_token_page`` writes slca train's tokens.html with this run's advantages and the reference estimators'."""
    tok = build_tokenizer()
    rollout_func, parts, shapes = scripted_rollout_func(tok)
    r_tool = [1.0, 0.0, 1.0, 0.0, 0.5, 0.0, 1.0, 0.25]
    r_sum = [0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 0.2, 0.9]

    def tool_r(completions, **_):
        return r_tool

    def sum_r(completions, **_):
        return r_sum

    t = SLCAGRPOTrainer(model=build_policy(tok), processing_class=tok, reward_funcs=[tool_r, sum_r],
                        args=base_args(tmp_path, shuffle_dataset=False), train_dataset=dataset(8), rollout_func=rollout_func)
    assert t.last_advantages is None
    out = t._generate_and_score_completions([dict(x) for x in t.train_dataset])
    b = t.last_advantages
    T = out["advantages"].shape[1]
    assert b.advantages.shape == b.completion_ids.shape == b.tool_mask.shape == b.summary_mask.shape
    torch.testing.assert_close(b.advantages[:, :T], out["advantages"])  # one process: its rows are the batch
    assert torch.equal(b.completion_ids[:, :T], out["completion_ids"]) and b.estimator == "slca" and b.num_generations == 4
    for i in range(8):  # the segments from the scripted parts: calls before the last tool result, the rest after it
        shape = shapes[i % 4]
        last_env = max((k for k, p in enumerate(shape) if p == "env"), default=-1)
        tool, summ = [], []
        for k, part in enumerate(shape):
            n = len(parts[part])
            is_policy = part != "env"
            tool += [int(is_policy and k < last_env)] * n
            summ += [int(is_policy and k > last_env)] * n
        assert b.tool_mask[i, : len(tool)].tolist() == tool and b.summary_mask[i, : len(summ)].tolist() == summ
    logged = t._metrics["train"]
    assert logged[M.ROLLOUT_NO_TOOL.name][-1] == pytest.approx(0.25)  # the answer-only shape: 2 rows of 8
    assert logged[M.ROLLOUT_NO_SUMMARY.name][-1] == 0.0

    page = t.write_token_page(tmp_path / "tokens.html")
    html = page.read_text()
    for name in ("slca", "grpo", "gdpo"):
        assert html.count(f'class="roll" data-estimator="{name}"') == 8, name
    assert "Weather in Paris? (0)" in html and "TRL step 0" in html
    a_tool, a_sum = group_norm(np.array(r_tool), 4), group_norm(np.array(r_sum), 4)
    assert f'data-adv="{a_tool[0]:+.3f}"' in html and f'data-adv="{a_sum[0]:+.3f}"' in html  # row 0: call, result, answer


def answers_only(tok):
    """A ``rollout_func`` whose every completion answers without a call (no tool segment anywhere)."""
    answer = tok.encode(ANSWER) + [tok.eos_token_id]

    def rollout_func(prompts, trainer):
        ids = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False) for p in prompts]
        return {"prompt_ids": ids, "completion_ids": [list(answer) for _ in prompts],
                "logprobs": [[0.0] * len(answer) for _ in prompts]}

    return rollout_func


def test_a_batch_without_tool_segments_or_a_tier_without_scores_warns_once_per_run(tmp_path):
    tok = build_tokenizer()
    rng = np.random.default_rng(0)

    def tool_none(completions, **_):
        return [None] * len(completions)

    def summary(completions, **_):
        return rng.random(len(completions)).tolist()

    t = SLCAGRPOTrainer(model=build_policy(tok), processing_class=tok, reward_funcs=[tool_none, summary],
                        args=base_args(tmp_path), train_dataset=dataset(8), rollout_func=answers_only(tok))
    batch = [dict(x) for x in t.train_dataset]
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        t._generate_and_score_completions(batch)
    said = [str(w.message) for w in first if str(w.message).startswith("slca: ")]
    assert len(said) == 2, said
    assert "none of the 8 rollouts of the batch at step 0 has a tool segment" in said[0] and "as GRPO" in said[0]
    assert "the 'tool' tier's reward functions ['tool_none'] returned None for all 8 rollouts" in said[1]
    assert t._metrics["train"][M.ROLLOUT_NO_TOOL.name][-1] == 1.0
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        t._generate_and_score_completions(batch)
    assert not [w for w in again if str(w.message).startswith("slca: ")]  # once per run


# ---------------------------------------------------------------- 9. a raising tool, the same in both hosts


def test_a_raising_tool_gives_the_same_error_result_as_slca_train_and_one_logged_traceback(tmp_path, caplog):
    """TRL swallowed a tool's exception into ``{'error': str(e)}``; slca's Python simulator crashed. Both now give
    the model ``"<tool> raised <Type>: <message>"`` and log the run's first traceback once."""
    import logging

    from transformers.utils import get_json_schema

    from slca.env import PythonSimulator

    def get_weather(city: str) -> str:
        """Get the current weather of a city.

        Args:
            city: The city name.
        """
        raise RuntimeError(f"station {city} offline")

    tok = build_tokenizer()
    t = SLCAGRPOTrainer(model=build_policy(tok), processing_class=tok, reward_funcs=[execution_reward, summary_reward],
                        args=base_args(tmp_path, max_tool_calling_iterations=2), train_dataset=dataset(8), tools=[get_weather])
    assert get_json_schema(t.tools[0]) == get_json_schema(get_weather)  # the schema TRL offers is the function's
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        out = t._generate_and_score_completions([dict(x) for x in t.train_dataset])
    texts = [tok.decode(ids[m.bool()]) for ids, m in zip(out["completion_ids"], out["completion_mask"])]
    slca_host = PythonSimulator([get_json_schema(get_weather)], {"get_weather": get_weather}).call("get_weather", {"city": "Paris"})
    assert slca_host.to_text() == '{"error": "get_weather raised RuntimeError: station Paris offline"}'
    called = [x for x in texts if "<tool_response>" in x]
    assert called and all(slca_host.to_text() in x for x in called), texts  # the bigram policy calls it for Paris
    logged = [r for r in caplog.records if r.name == "slca.env" and r.exc_info]
    assert len(logged) == 1 and logged[0].exc_info[0] is RuntimeError  # once, however many calls raised


# ---------------------------------------------------------------- 5. install and errors


def test_config_typos_are_refused_when_the_config_is_made_with_the_closest_name(tmp_path):
    with pytest.raises(ValueError, match=r"^reward_tiers: 'sumary' is not a tier \(did you mean 'summary'\?\)"):
        base_args(tmp_path, reward_tiers=["tool", "sumary"])
    with pytest.raises(ValueError, match="no reward function is declared 'summary'"):
        base_args(tmp_path, reward_tiers=["tool", "tool"])
    with pytest.raises(ValueError, match=r"unknown estimator 'slac' \(did you mean 'slca'\?\)"):
        base_args(tmp_path, advantage_estimator="slac")
    with pytest.raises(ValueError) as e:
        base_args(tmp_path, advantage_estimator="slca_turn", estimator_options={"turn_lamda": 0.5})
    # only what estimator_options may set in TRL; the options TRL's own fields set are named as those fields
    assert ("estimator 'slca_turn' has no option 'turn_lamda' (did you mean 'turn_lambda'?); its options: "
            "['empty_summary', 'empty_tool', 'turn_lambda']; the others come from SLCAGRPOConfig.advantage_eps, "
            "SLCAGRPOConfig.scale_rewards") == str(e.value)


def test_reward_tiers_are_counted_before_the_model_loads(tmp_path):
    """Three functions, two tiers: refused before the (unloadable) model is looked at."""
    with pytest.raises(ValueError, match=r"reward_tiers must give one of .* for each of the 3 reward functions"):
        SLCAGRPOTrainer(model="nobody/no-such-model", reward_funcs=[execution_reward, summary_reward, summary_reward],
                        args=base_args(tmp_path, reward_tiers=["tool", "summary"]), train_dataset=dataset(8))


@pytest.mark.slow
def test_the_example_with_lora_and_no_peft_says_what_to_install(tmp_path):
    r = run_example(tmp_path, ["--model", "default", "--lora_r", "8", *SMALL_RUN], block="peft")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert last_line(r.stderr) == '--lora_r 8: LoRA needs peft, which is not installed: pip install "slca[peft]"'


@pytest.mark.slow
def test_slca_eval_bfcl_without_its_package_says_what_to_install_before_the_model_loads(tmp_path):
    boot = "import sys; sys.modules['bfcl_eval'] = None; from slca.cli import main; sys.argv = ['slca', *sys.argv[1:]]; main()"
    r = subprocess.run([sys.executable, "-c", boot, "eval", "--model", "nobody/not-loaded", "--suite", "bfcl", "--out",
                        str(tmp_path / "ev")], capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-3000:]
    line = last_line(r.stderr)
    assert line.startswith("error: --suite bfcl needs its benchmark's package (") and "Traceback" not in r.stderr
    assert line.endswith('pip install --no-deps "bfcl-eval==2026.3.23" filelock mpmath; in a checkout: make eval')


@pytest.mark.slow
def test_the_examples_are_quiet_by_default(tmp_path):
    """Every TRL run printed transformers' gradient_checkpointing FutureWarnings and TRL's experimental notice."""
    env = {k: v for k, v in ENV.items() if k != "TRL_EXPERIMENTAL_SILENCE"}  # as a user's shell has it
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in SMALL_RUN]
    r = subprocess.run([sys.executable, EXAMPLE, "--model", "default", "--n_tasks", "4", "--per_device_train_batch_size", "4",
                        "--num_generations", "4", "--max_completion_length", "64", "--max_tool_calling_iterations", "1", *argv],
                       capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    for noise in ("FutureWarning", "DeprecationWarning", "is deprecated", "experimental feature"):
        assert noise not in r.stderr, r.stderr[-3000:]


def test_quieting_the_known_notices_leaves_every_other_warning(monkeypatch):
    from slca.integrations.trl import quiet_known_warnings

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "")  # recorded, so the value quiet_known_warnings sets is undone after
    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_known_warnings()
        warnings.warn("`gradient_checkpointing_enable` is deprecated and will be removed in v6. Use x instead.", FutureWarning)
        warnings.warn("`use_cache` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("something else", UserWarning)
    assert [str(w.message) for w in seen] == ["`use_cache` is deprecated and will be removed in v6.", "something else"]
    assert os.environ["TRL_EXPERIMENTAL_SILENCE"] == "1"  # TRL's own switch for its experimental notice


def test_make_trl_installs_the_extras_without_moving_the_installed_torch(tmp_path):
    venv = tmp_path / "venv"
    r = subprocess.run(["make", "-n", "trl", f"VENV={venv}"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    torch_first = next(i for i, ln in enumerate(lines) if 'pip install -q "torch==' in ln)
    pin = next(i for i, ln in enumerate(lines) if "print('torch==' + torch.__version__)" in ln and "torch-constraints.txt" in ln)
    extras = next(i for i, ln in enumerate(lines) if '".[trl,peft]"' in ln)
    assert torch_first < pin < extras and f"-c {venv}/torch-constraints.txt" in lines[extras]


@pytest.mark.slow
def test_slca_train_gives_a_pretrained_model_its_own_lr_and_checkpoint_defaults(tmp_path):
    """``model=smollm2`` kept the tiny model's lr 2e-4 (gradient norm about 6) and left a 1.6 GB checkpoint per save:
    fully fine-tuned, a pretrained model gets lr 1e-5 and keeps one checkpoint unless they are set, and says so."""
    from slca.models.named import named_model_problem
    from slca.training.config import TrainConfig, config_warnings, load_config

    if named_model_problem("smollm2"):
        pytest.skip(named_model_problem("smollm2"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")  # a run is there: the command stops before any model loads

    def train(*sets: str) -> str:
        args = [a for kv in ("model=smollm2", f"run_dir={run}", *sets) for a in ("--set", kv)]
        r = subprocess.run([sys.executable, "-m", "slca.cli", "train", *args], capture_output=True, text=True, timeout=600,
                           env=ENV, cwd=tmp_path)
        assert r.returncode == 2 and "already holds a run" in r.stderr, r.stderr[-3000:]
        return r.stderr

    assert "warning: fully fine-tuning the pretrained 'smollm2': lr=1e-05 and keep_checkpoints=1, the pretrained-model defaults" in train()
    assert "warning: lr=0.0002 is the default sized for the embedded tiny model; full fine-tuning of the pretrained 'smollm2'" in train("lr=2e-4")
    cfg = load_config(None, ["model=smollm2"])
    assert (cfg.lr, cfg.keep_checkpoints) == (1e-5, 1)
    assert (load_config(None, ["model=smollm2", "keep_checkpoints=3"]).keep_checkpoints, load_config(None, ["model=smollm2", "lr=3e-5"]).lr) == (3, 3e-5)
    lora = load_config(None, ["model=smollm2", "lora_r=8"])  # adapters: 2e-4 is a usual rate, checkpoints are small
    assert (lora.lr, lora.keep_checkpoints) == (TrainConfig.lr, TrainConfig.keep_checkpoints) and config_warnings(lora) == []
    assert (load_config(None, []).lr, load_config(None, []).keep_checkpoints) == (TrainConfig.lr, TrainConfig.keep_checkpoints)
    assert config_warnings(TrainConfig(model="smollm2", lr=1e-5)) == [] and config_warnings(TrainConfig()) == []
