"""Trainer options a TRL user expects: LoRA, dtype, the LR schedule, chat_template, and
one-line errors from `slca train` for the model, device and template."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _tok import make_qwen_tokenizer, tiny_qwen2, trl_template, trl_template_dir
from test_trainer import _cfg, _comparable, _read, _trainer_kwargs, tiny  # noqa: F401  (tiny: a fixture)
from typer.testing import CliRunner

from slca.cli import app
from slca.training.config import TrainConfig, file_overrides, validate
from slca.training.trainer import _lr_schedule, train


def _base_key(k: str) -> str:
    return k.replace("base_model.model.", "").replace(".base_layer", "")


@pytest.mark.slow
def test_lora_trains_adapters_only_and_resumes_exactly(tmp_path, tiny):
    pytest.importorskip("peft")
    lora = dict(lora_r=4, lora_alpha=8.0, lora_target_modules=["q_proj", "v_proj"], steps=2, eval_every=2, save_every=1)
    kw = _trainer_kwargs(tiny)
    base = {k: v.clone() for k, v in kw["model"].state_dict().items()}
    tr = train(_cfg(tmp_path / "a", run_dir=str(tmp_path / "a"), **lora), **kw)
    sd = tr.model.state_dict()
    frozen = {_base_key(k): v for k, v in sd.items() if "lora_" not in k}
    assert frozen.keys() == base.keys() and all(torch.equal(base[k], frozen[k]) for k in base)  # the base did not move
    lora_b = [v for k, v in sd.items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().sum()) > 0 for v in lora_b)  # lora_B starts at 0: every adapter trained
    rows = _read(tmp_path / "a")
    assert rows[-1]["ppo/kl"] > 0  # the reference is the base with the adapters off, not the policy
    ckpt = tmp_path / "a" / "checkpoints" / "step-000002"
    assert (ckpt / "adapter_model.safetensors").exists() and not (ckpt / "model.safetensors").exists()
    # stop after step 1, resume in a new trainer (same base model, fresh adapters): same metrics
    part = _cfg(tmp_path / "b", run_dir=str(tmp_path / "b"), **lora)
    train(part, stop_after=1, **_trainer_kwargs(tiny))
    train(part, resume=True, **_trainer_kwargs(tiny))
    a, b = _comparable(rows), _comparable(_read(tmp_path / "b"))
    assert [r["step"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):
        for k, v in ra.items():
            assert rb[k] == (pytest.approx(v, rel=1e-5, abs=1e-6) if isinstance(v, float) else v), k


@pytest.mark.slow
def test_bfloat16_rollouts_and_training(tmp_path, tiny):
    kw = _trainer_kwargs(tiny)
    before = {k: v.to(torch.bfloat16) for k, v in kw["model"].state_dict().items()}
    tr = train(_cfg(tmp_path, dtype="bfloat16", steps=2, save_every=0, eval_every=2), **kw)
    assert {p.dtype for p in tr.model.parameters()} == {torch.bfloat16}
    moved = sum(int(not torch.equal(before[k], v)) for k, v in tr.model.state_dict().items())
    assert moved > len(before) // 2
    for r in _read(tmp_path / "run"):
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad/norm"])


@pytest.mark.parametrize("warmup", [0, 1, 2, 5])
def test_lr_schedule_is_transformers_with_the_previous_rates(warmup):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = _lr_schedule(opt, validate(TrainConfig(warmup_steps=warmup, steps=10)))
    used = []
    for _ in range(10):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # the hand-written schedule this replaced: LambdaLR(lambda s: min(1, (s + 1) / max(warmup, 1)))
    assert used == [min(1.0, (s + 1) / max(warmup, 1)) for s in range(10)]


def test_decaying_schedule_ends_above_zero():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = _lr_schedule(opt, validate(TrainConfig(lr_scheduler_type="linear", warmup_steps=2, steps=6)))
    used = []
    for _ in range(6):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warmup to the peak, then linear decay over the remaining updates, the last one still learning
    assert used == pytest.approx([0.5, 1.0, 0.8, 0.6, 0.4, 0.2])


# ------------------------------------------------------------------ `slca train` errors and chat_template


@pytest.fixture(scope="module")
def qwen3_run(tmp_path_factory):
    """A tiny Qwen2 that calls a tool (it memorised a gold demo of one toolworld task), saved with
    Qwen3's chat template, which re-renders an assistant turn once tool messages follow; and
    that task as a one-task suite file."""
    from _tok import gold_demo_messages, memorise

    from slca.env import toolworld

    task = next(t for t in toolworld.make_tasks("train", n=40, seed=0) if t.kind == "single")
    demo = gold_demo_messages(task)
    training = trl_template("qwen3_training")
    tok = make_qwen_tokenizer(training, corpus=[make_qwen_tokenizer(training).apply_chat_template(demo, tools=task.tools, tokenize=False)])
    model = memorise(tiny_qwen2(len(tok), seed=2), tok, [(demo, task.tools)])
    tok.chat_template = trl_template("qwen3")
    d = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    row = {"id": task.id, "messages": task.messages, "tools": task.tools, "kind": task.kind,
           "gold": [[{"name": c.name, "arguments": c.arguments} for c in step] for step in task.gold]}
    (d / "task.jsonl").write_text(json.dumps(row) + "\n")
    return d


def _train(tmp_path, *sets: str):
    small = ["steps=1", "tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=8", "eval_tasks=4",
             "save_every=0", "report_to=none", "sample_html_every=0", f"run_dir={tmp_path / 'run'}"]
    return CliRunner().invoke(app, ["train"] + [x for s in small + list(sets) for x in ("--set", s)])


def _one_line_error(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    (line,) = [x for x in res.output.splitlines() if x.startswith("error:")]
    return line


@pytest.mark.slow
def test_prefix_template_error_is_one_line_and_its_advice_works(tmp_path, qwen3_run):
    run = [f"model={qwen3_run}", f"suite={qwen3_run / 'task.jsonl'}", "tasks_per_step=1", "max_new_tokens=96", "temperature=0.05"]
    line = _one_line_error(_train(tmp_path, *run))
    training = trl_template_dir() / "qwen3_training.jinja"
    assert "not prefix-preserving" in line and f"--set chat_template={training}" in line
    res = _train(tmp_path, *run, f"chat_template={training}")
    assert res.exit_code == 0, res.output
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["rollout/tool_turns"] > 0  # the rollouts called the tool and went on


@pytest.mark.parametrize("setting,needle", [
    ("model=nobody/no-such-model", "'nobody/no-such-model'"),
    ("dtype=int8", "dtype: must be one of"),
    ("report_to=comet", "unknown tracker 'comet'"),
] + ([("device=cuda", "device: 'cuda': CUDA is not available")] if not torch.cuda.is_available() else []))
def test_train_refuses_in_one_line(tmp_path, setting, needle):
    assert needle in _one_line_error(_train(tmp_path, setting))


def test_version():
    import slca

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"slca {slca.__version__}"


def test_version_matches_pyproject():
    import pathlib
    import tomllib

    import slca

    meta = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["version"] == slca.__version__


def test_compare_reads_the_config_file(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("estimator: grpo\nrun_dir: x\nlr: 1e-4\nreport_to: [tensorboard, wandb]\n")
    assert file_overrides(cfg, drop=("estimator", "seed", "run_dir")) == (["lr=1e-4", "report_to=tensorboard,wandb"], ["estimator", "run_dir"])
    cfg.write_text("steps: 0\n")
    res = CliRunner().invoke(app, ["compare", "-c", str(cfg), "--estimators", "grpo", "--seeds", "0", "--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and "steps: must be > 0" in res.output and not (tmp_path / "c").exists()


def test_public_api_names_train_and_config():
    import slca

    assert {"train", "TrainConfig"} <= set(slca.__all__) and {"train", "TrainConfig"} <= set(dir(slca))
    assert slca.TrainConfig is TrainConfig


def test_config_parses_with_hfargumentparser_as_with_set(tmp_path):
    from transformers import HfArgumentParser

    from slca.training.config import load_config

    parser = HfArgumentParser(TrainConfig)
    (a,) = parser.parse_args_into_dataclasses(["--lr", "1e-4", "--report_to", "tensorboard", "trackio", "--eval_on_start",
                                               "--lora_target_modules", "q_proj", "v_proj", "--dtype", "bfloat16"])
    b = load_config(None, ["lr=1e-4", "report_to=tensorboard,trackio", "eval_on_start=true", "lora_target_modules=q_proj,v_proj", "dtype=bfloat16"])
    assert validate(a) == b
    y = tmp_path / "c.yaml"
    y.write_text("lr: 0.0001\nreport_to: [none]\nwarmup_steps: 0\n")
    (c,) = parser.parse_yaml_file(str(y))
    assert validate(c) == load_config(y)
    # the fields' own metadata: Literal choices become argparse choices, estimator options a list
    (d,) = parser.parse_args_into_dataclasses(["--loss_agg", "seq_mean", "--estimator", "slca_cond",
                                               "--estimator_options", "cond_std=subgroup"])
    assert validate(d) == load_config(None, ["loss_agg=seq_mean", "estimator=slca_cond", "estimator_options=cond_std=subgroup"])
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--loss_agg", "sum"])
    assert "Dr. GRPO" in parser.format_help()  # scale's help, declared once on the estimator's options


def test_minibatch_rows_default_is_the_row_shuffle_of_before():
    from types import SimpleNamespace

    from slca.training.trainer import Trainer

    cfg = validate(TrainConfig(tasks_per_step=4, group_size=3, minibatches=2, seed=7))
    got = Trainer._minibatch_rows(SimpleNamespace(cfg=cfg), [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], 5, 1)
    want = torch.randperm(12, generator=torch.Generator().manual_seed(7 + 31 * 5 + 1)).chunk(2)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]  # the seeded results in docs/ depend on it


@pytest.mark.parametrize("minibatches", [1, 2, 3, 4])
def test_group_minibatches_hold_whole_groups(minibatches):
    from types import SimpleNamespace

    from slca.training.trainer import Trainer

    cfg = validate(TrainConfig(tasks_per_step=4, group_size=3, minibatches=minibatches, group_minibatches=True, seed=7))
    gids = [10, 11, 12, 13] * 3  # rows of a group need not be adjacent
    me = SimpleNamespace(cfg=cfg)
    parts = Trainer._minibatch_rows(me, gids, 5, 0)
    assert len(parts) == minibatches
    assert sorted(i for p in parts for i in p.tolist()) == list(range(12))  # every row once
    for p in parts:
        groups = {gids[i] for i in p.tolist()}
        assert len(p) == 3 * len(groups) > 0  # whole groups only
    assert [p.tolist() for p in Trainer._minibatch_rows(me, gids, 5, 0)] == [p.tolist() for p in parts]  # seeded
    if minibatches > 1:
        other = [Trainer._minibatch_rows(me, gids, 5, e) for e in range(1, 6)]
        assert any([p.tolist() for p in o] != [p.tolist() for p in parts] for o in other)  # reshuffled per epoch


def test_group_minibatches_refuses_more_minibatches_than_groups():
    with pytest.raises(ValueError, match="minibatches"):
        validate(TrainConfig(tasks_per_step=2, group_size=4, minibatches=3, group_minibatches=True))
    validate(TrainConfig(tasks_per_step=2, group_size=4, minibatches=3))  # rows, not groups: fine


@pytest.mark.slow
def test_group_minibatches_train_each_prompt_once_per_minibatch(tmp_path, tiny, monkeypatch):
    import slca.generation.fastpath.logprobs as fl

    seen = []
    shared = fl.shared_prompts

    def spy(batch):
        out = shared(batch)
        seen.append((batch.input_ids.shape[0], None if out is None else len(out[0])))
        return out

    monkeypatch.setattr(fl, "shared_prompts", spy)
    cfg = _cfg(tmp_path, steps=1, tasks_per_step=4, group_size=2, minibatches=2, group_minibatches=True, kl_coef=0.0,
               eval_every=0, save_every=0, sample_html_every=0, diag_every=0)
    train(cfg, **_trainer_kwargs(tiny))
    assert seen == [(4, 2), (4, 2)]  # two minibatches of 2 whole groups: 2 prompts, each run once
