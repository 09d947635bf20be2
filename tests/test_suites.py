"""Training suites from files and datasets folders, with held-out evaluation (eval_suite / eval_fraction) and the prompt budget."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from slca.env import save_tasks, toolworld
from slca.env.loaders import task_to_row
from slca.env.suites import fit_suites, load_suites
from slca.training.config import TrainConfig, validate

FIX = Path(__file__).parent / "fixtures" / "env"


def test_held_out_tasks(tmp_path, caplog):
    path = save_tasks(toolworld.make_tasks("train", n=20, seed=0), tmp_path / "mine.jsonl")
    tr, held, ood, env = load_suites(str(path), 0, eval_fraction=0.25, ood_splits=["test"])
    assert ood == {}  # toolworld's splits are not evaluated for a file suite
    assert len(tr) == 15 and len(held) == 5 and not {t.id for t in tr} & {t.id for t in held}
    tr2, held2, _, _ = load_suites(str(path), 0, eval_suite=str(FIX / "verl_small.jsonl"))
    assert len(tr2) == 20 and [t.id for t in held2] == ["0", "1", "2", "3"]
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        _, none, _, _ = load_suites(str(path), 0, ood_splits=["test"])
    assert none == [] and "has no held-out evaluation" in caplog.text and "not evaluated for suite" in caplog.text
    _, tw_held, tw_ood, _ = load_suites("toolworld", 0, ood_splits=["test", "heldout_tools"])
    assert tw_held and all(t.meta["split"] == "train_heldout" for t in tw_held)  # the default: in distribution
    assert {s: {t.meta["split"] for t in ts} for s, ts in tw_ood.items()} == {"test": {"test"}, "heldout_tools": {"heldout_tools"}}
    _, tw_test, _, _ = load_suites("toolworld", 0, eval_split="test")
    assert tw_test and all(t.meta["split"] == "test" for t in tw_test)
    with pytest.raises(ValueError, match="not both"):
        load_suites(str(path), 0, eval_suite=str(path), eval_fraction=0.1)
    with pytest.raises(ValueError, match="eval_fraction is for a file suite"):
        load_suites("toolworld", 0, eval_fraction=0.1)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: holds no rows"):
        load_suites(str(tmp_path / "empty.jsonl"), 0)


def test_prompt_budget_applies_to_loaded_tasks(caplog):
    from _tok import make_qwen_tokenizer

    tok = make_qwen_tokenizer()
    suite = str(FIX / "toucan_small.parquet")
    tr, held, _, _ = load_suites(suite, 0, eval_fraction=0.3)
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        tr2, held2 = fit_suites(tr, held, tok, 1500, suite=suite)
    assert 0 < len(tr2) + len(held2) < 6 and "have a prompt of max_total_tokens=1500 tokens or more" in caplog.text
    with pytest.raises(ValueError, match="none is left"):
        fit_suites(tr, held, tok, 50, suite=suite)
    tw_train, tw_test, _, _ = load_suites("toolworld", 0)
    assert fit_suites(tw_train[:5], tw_test[:5], tok, 50, suite="toolworld") == (tw_train[:5], tw_test[:5])  # toolworld is not checked


def test_config_fields(tmp_path):
    f = str(FIX / "verl_small.jsonl")
    validate(TrainConfig(suite=f, eval_fraction=0.2))
    validate(TrainConfig(suite=f, eval_suite=str(FIX / "toucan_small.parquet")))
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"a": 1}]).save_to_disk(str(tmp_path / "ds"))
    validate(TrainConfig(suite=str(tmp_path / "ds")))
    for kw, msg in ((dict(suite=f, eval_fraction=1.0), "eval_fraction: must be in"), (dict(suite=f, eval_fraction=-0.1), "must be in"),
                    (dict(suite=f, eval_fraction=0.2, eval_suite=f), "not both"), (dict(eval_fraction=0.2), "for a file suite"),
                    (dict(suite=f, eval_suite=str(tmp_path / "nope.jsonl")), "eval_suite: .*no such file"),
                    (dict(suite=str(tmp_path)), "not a datasets save_to_disk folder")):
        with pytest.raises(ValueError, match=msg):
            validate(TrainConfig(**kw))


@pytest.mark.slow
def test_training_on_a_datasets_folder_evaluates_on_its_held_out_share(tmp_path):
    """`--set suite=<save_to_disk folder> --set eval_fraction=0.25`: eval metrics are real numbers, not missing."""
    datasets = pytest.importorskip("datasets")
    from recipes.warmstart.config import ModelSize
    from recipes.warmstart.build import make_model
    from recipes.warmstart.tokenizer import train_tokenizer
    from slca.training.trainer import train

    tasks = toolworld.make_tasks("train", n=24, seed=0)
    datasets.Dataset.from_list([task_to_row(t) for t in tasks]).save_to_disk(str(tmp_path / "mine"))
    texts = [m["content"] for t in tasks for m in t.messages] + [json.dumps(t.tools) for t in tasks[:5]]
    tok = train_tokenizer(texts * 3, vocab_size=400)
    size = ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                     max_position_embeddings=1024)
    cfg = validate(TrainConfig(run_dir=str(tmp_path / "run"), suite=str(tmp_path / "mine"), eval_fraction=0.25, steps=2, tasks_per_step=2,
                               group_size=2, max_turns=1, max_new_tokens=8, max_total_tokens=1024, minibatches=1, eval_every=1, eval_tasks=6,
                               save_every=0, sample_html_every=0, summary_noise=0.5))
    tr = train(cfg, model=make_model(size, tok, seed=0), tokenizer=tok)
    assert len(tr.train_tasks) == 18 and len(tr.eval_tasks) == 6
    assert not {t.id for t in tr.train_tasks} & {t.id for t in tr.eval_tasks}
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = {k: v for k, v in rows[-1].items() if k.startswith("eval/")}
    for k in ("eval/name_f1", "eval/arg_match", "eval/process", "eval/success", "eval/reward_tool", "eval/reward_summary"):
        assert evals[k] is not None and math.isfinite(evals[k]), (k, evals)


def test_a_toolworld_task_file_runs_against_toolworld_in_train_and_eval(tmp_path):
    """slca train and slca eval load a task file through one loader (load_suite): toolworld tasks saved to a
    file get toolworld's world in both (their gold calls get toolworld's results, not the schema simulator's)."""
    from slca.env import PythonSimulator, SchemaSimulator
    from slca.env.suites import load_suite
    from slca.eval.runner import EvalConfig, _in_domain

    tasks = [t for t in toolworld.make_tasks("test", n=30, seed=0) if t.gold][:8]
    path = save_tasks(tasks, tmp_path / "tw.jsonl")
    run = _in_domain(EvalConfig(model="unused", suite="toucan", data=str(path)))  # what slca eval --suite toucan --data rolls out against
    eval_tasks, eval_env = run.keywords["tasks"], run.keywords["make_env"]
    train_tasks, train_env = load_suite(str(path), "train", 0)

    def results(task, env):
        return [[(r.ok, r.content) for r in step] for step in toolworld.run_gold(task, env)]

    assert [t.id for t in eval_tasks] == [t.id for t in train_tasks] == [t.id for t in tasks]
    schema_differs = 0
    for task, ev, tr in zip(tasks, eval_tasks, train_tasks):
        assert isinstance(eval_env(ev), PythonSimulator) and isinstance(train_env(tr), PythonSimulator)
        world = results(task, toolworld.make_env(task))
        assert results(ev, eval_env(ev)) == world == results(tr, train_env(tr))
        schema_differs += results(ev, SchemaSimulator(ev.tools, seed=0)) != world
    assert schema_differs  # the schema simulator would have answered otherwise: the check can fail
