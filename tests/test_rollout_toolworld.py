"""Rollouts against the real toolworld simulator, with the project's tokenizer and chat template.

A tiny Qwen2 memorises gold demonstrations of a parallel and a chain task
(tool results from ``toolworld.make_env``); greedy rollouts must then reproduce
them through the engine: same messages, the simulator's real answers, exact
masks, and full marks from the in-domain metrics.
"""

from __future__ import annotations

import pytest
import torch
from _tok import gold_demo_messages, memorise, tiny_qwen2

from slca import segment_masks
from slca.chat import encode_conversation
from slca.env import toolworld
from recipes.warmstart.tokenizer import train_tokenizer
from slca.generation.rollout import RolloutConfig, generate_rollouts, trajectory_logprobs
from slca.rewards import in_domain_metrics


demo_messages = gold_demo_messages


@pytest.fixture(scope="module")
def world():
    tasks = toolworld.make_tasks("train", n=80, seed=0)
    picked = [next(t for t in tasks if t.kind == "parallel"), next(t for t in tasks if t.kind == "chain" and len(t.gold) >= 2)]
    demos = [demo_messages(t) for t in picked]
    from slca.models.tokenizer import chat_template

    probe = train_tokenizer(["x"], vocab_size=300)
    texts = [probe.apply_chat_template(demo_messages(t), tools=t.tools, tokenize=False, chat_template=chat_template()) for t in tasks[:40]]
    tok = train_tokenizer(texts, vocab_size=700)
    model = memorise(tiny_qwen2(len(tok), seed=2), tok, [(d, t.tools) for d, t in zip(demos, picked)])
    return tok, model, picked, demos


def test_rollouts_reproduce_gold_demos_against_toolworld(world):
    tok, model, tasks, demos = world
    cfg = RolloutConfig(group_size=2, max_turns=4, max_new_tokens=96, max_total_tokens=1024, temperature=0.0, seed=0)
    res = generate_rollouts(model, tok, tasks, toolworld.make_env, cfg)
    assert len(res.trajectories) == 4 and [t.group_id for t in res.trajectories] == [0, 0, 1, 1]
    for i, tr in enumerate(res.trajectories):
        task, demo = tasks[i // 2], demos[i // 2]
        assert tr.stop_reason == "final_answer"
        assert tr.messages == demo
        assert tr.final_text == task.reference_answer
        assert [[c.key() for c in s] for s in tr.calls] == [[c.key() for c in s] for s in task.gold]
        assert all(r.ok for t in tr.turns for r in t.results)
        assert in_domain_metrics(task, tr.turns)["success"] == 1.0
        enc = encode_conversation(tok, tr.messages, task.tools)
        n = len(tr.prompt_ids) + len(tr.response_ids)
        assert enc.input_ids[:n] == tr.prompt_ids + tr.response_ids
        assert enc.model_mask[len(tr.prompt_ids) : n] == tr.model_mask
        mm = torch.tensor([tr.model_mask])
        tool_m, summ_m = segment_masks(mm, torch.ones_like(mm))
        assert tok.decode([x for x, m in zip(tr.response_ids, summ_m[0].tolist()) if m]) == tr.final_text + "<|im_end|>"
        assert int(tool_m.sum()) == sum(tr.model_mask) - int(summ_m.sum()) > 0


def test_sampled_toolworld_rollouts_rescore(world):
    tok, model, tasks, _ = world
    cfg = RolloutConfig(group_size=4, max_turns=3, max_new_tokens=64, max_total_tokens=700, temperature=1.0, seed=4)
    res = generate_rollouts(model, tok, tasks, toolworld.make_env, cfg)
    for tr, lp in zip(res.trajectories, trajectory_logprobs(model, res.trajectories, 1.0)):
        m = torch.tensor(tr.model_mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(tr.logprobs)[m], lp[m], atol=1e-4, rtol=1e-4)
