"""The step-0 evaluation shared between runs (slca.training.baseline_cache): its key, its store, and two real
runs of different estimators that share one computation."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from test_trainer import _cfg, _read, _trainer_kwargs, tiny  # noqa: F401  (tiny: a fixture)

from slca.env import toolworld
from slca.training.baseline_cache import BASELINE_CACHE_ENV, baseline_key, cached_baseline
from slca.training.trainer import train


def test_the_key_changes_with_the_weights_the_tasks_and_the_settings():
    m = torch.nn.Linear(3, 2)
    tasks = toolworld.make_tasks("test", n=3, seed=0)
    k = baseline_key(m, {"eval": tasks}, {"temperature": 0.0})
    assert k == baseline_key(m, {"eval": list(tasks)}, {"temperature": 0.0})  # same content, same key
    twin = torch.nn.Linear(3, 2)
    twin.load_state_dict(m.state_dict())
    assert baseline_key(twin, {"eval": tasks}, {"temperature": 0.0}) == k
    with torch.no_grad():
        twin.weight[0, 0] += 1e-6
    assert baseline_key(twin, {"eval": tasks}, {"temperature": 0.0}) != k
    assert baseline_key(m, {"eval": tasks[:2]}, {"temperature": 0.0}) != k
    assert baseline_key(m, {"eval": tasks, "eval_test": tasks}, {"temperature": 0.0}) != k
    assert baseline_key(m, {"eval": tasks}, {"temperature": 1.0}) != k
    assert baseline_key(m.to(torch.float64), {"eval": tasks}, {"temperature": 0.0}) != k


def test_the_store_computes_once_reads_after_and_recomputes_a_damaged_entry(tmp_path, caplog):
    calls = []

    def evaluate():
        calls.append(1)
        return {"eval/success": 0.5, "eval/nan": float("nan")}

    m, hit = cached_baseline(evaluate, lambda: "k1", str(tmp_path))
    assert (len(calls), hit, m["eval/success"]) == (1, None, 0.5)
    m2, hit = cached_baseline(evaluate, lambda: "k1", str(tmp_path))
    assert len(calls) == 1 and hit == str(tmp_path / "k1.json") and m2["eval/success"] == 0.5 and m2["eval/nan"] != m2["eval/nan"]
    (tmp_path / "k1.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="slca.train"):
        _, hit = cached_baseline(evaluate, lambda: "k1", str(tmp_path))
    assert len(calls) == 2 and hit is None and "unreadable" in caplog.text
    assert json.loads((tmp_path / "k1.json").read_text())["metrics"]["eval/success"] == 0.5  # rewritten
    # no folder: no cache, nothing written; a folder that cannot be written: a warning, the metrics still come
    assert cached_baseline(evaluate, lambda: pytest.fail("no key without a cache"), "")[1] is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="slca.train"):
        m3, _ = cached_baseline(evaluate, lambda: "k2", str(blocker / "sub"))
    assert m3["eval/success"] == 0.5 and "not cached" in caplog.text


def test_two_estimators_of_one_seed_share_the_step0_evaluation(tmp_path, tiny, monkeypatch, capsys):
    """grpo then slca, seed 0, one cache: the second run reads the first's step-0 evaluation, which equals what it
    computes itself without the cache; a run of another seed (other weights) computes its own."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(BASELINE_CACHE_ENV, str(cache))
    kw = dict(steps=1, eval_on_start=True, eval_every=1, save_every=0, sample_html_every=0)
    train(_cfg(tmp_path, run_dir=str(tmp_path / "g"), estimator="grpo", **kw), **_trainer_kwargs(tiny))
    assert len(list(cache.glob("*.json"))) == 1 and "baseline cache" not in capsys.readouterr().out
    train(_cfg(tmp_path, run_dir=str(tmp_path / "s"), estimator="slca", **kw), **_trainer_kwargs(tiny))
    assert "step-0 evaluation read from the baseline cache" in capsys.readouterr().out
    monkeypatch.delenv(BASELINE_CACHE_ENV)
    train(_cfg(tmp_path, run_dir=str(tmp_path / "s2"), estimator="slca", **kw), **_trainer_kwargs(tiny))
    cached, fresh = _read(tmp_path / "s")[0], _read(tmp_path / "s2")[0]
    assert cached["step"] == fresh["step"] == 0
    evals = {k: v for k, v in fresh.items() if k.startswith("eval") or k.startswith("probe")}
    assert evals and all(cached[k] == pytest.approx(v, abs=1e-6, nan_ok=True) for k, v in evals.items())
    monkeypatch.setenv(BASELINE_CACHE_ENV, str(cache))
    train(_cfg(tmp_path, run_dir=str(tmp_path / "g1"), estimator="grpo", seed=1, **kw), **_trainer_kwargs(tiny, seed=1))
    assert len(list(cache.glob("*.json"))) == 2


def test_evaluation_in_batches_scores_as_one_batch(tmp_path, tiny):
    """eval_batch_size=1 (each task alone) and 0 (auto: all in one batch for this model) give the same greedy
    evaluation; the auto size is what a 2 GiB KV cache holds (SmolLM2-135M's OOM on 250 tasks in one batch)."""
    from slca.generation.kvcache import kv_bytes_per_token, rows_within
    from slca.training.trainer import EVAL_KV_BUDGET, Trainer

    rows = {}
    for bs in (0, 1):
        tr = Trainer(_cfg(tmp_path, run_dir=str(tmp_path / f"b{bs}"), eval_batch_size=bs, eval_tasks=6), **_trainer_kwargs(tiny))
        assert tr.eval_batch() == (bs or rows_within(tr.model, tr.cfg.max_total_tokens, EVAL_KV_BUDGET))
        rows[bs] = tr.evaluate_on(tr.eval_tasks, "eval")
    assert rows[0].keys() == rows[1].keys()
    assert all(rows[1][k] == pytest.approx(v, abs=1e-6, nan_ok=True) for k, v in rows[0].items())
    m = tr.model
    per_tok = kv_bytes_per_token(m)
    c = m.config
    assert per_tok == c.num_hidden_layers * 2 * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    assert rows_within(m, 1000, per_tok * 1000 * 3 + 5) == 3 and rows_within(m, 10**9, 1) == 1
    assert rows_within(torch.nn.Linear(2, 2), 100, 1) > 10**6  # no transformers config: no limit
