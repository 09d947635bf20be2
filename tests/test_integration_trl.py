"""SLCA inside TRL's real GRPOTrainer, on CPU (extra ``slca[trl]``).

The policy is a real ``Qwen2ForCausalLM`` whose weights are set by hand so that it
is a bigram sampler: after the assistant header's ``\\n`` it opens a tool call with
probability 1/2 and otherwise answers; a call always reads
``<tool_call>{get_weather(Paris)}</tool_call><|im_end|>``. A randomly initialised
model never emits a parseable call, so this is the smallest real model that drives
TRL's own tool loop. The tokenizer is byte-level BPE built locally, with Qwen's
special tokens and TRL's Qwen2.5 chat template (so TRL attaches its own response
parser). Expected advantages are computed here by hand, not with slca.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("datasets")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.chat_template_utils import qwen2_5_chat_template  # noqa: E402

from slca.core.registry import get_estimator, list_estimators  # noqa: E402
from slca.integrations.trl import (  # noqa: E402
    SLCAGRPOConfig,
    SLCAGRPOTrainer,
    check_trl_contract,
    tier_rewards,
    trl_batch_advantages,
)

BUILTIN_ESTIMATORS = list_estimators()  # before any test registers its own

CALL = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
ANSWER = "It is sunny in Paris."
EPS = 1e-4  # TRL's constant, and SLCAGRPOConfig's default


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"]
    )
    tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", CALL, ANSWER])
    tok.chat_template = qwen2_5_chat_template
    return tok


def build_policy(tok: PreTrainedTokenizerFast, p_call: float = 0.5, sharp: float = 30.0) -> Qwen2ForCausalLM:
    """A Qwen2 whose next-token logits depend only on the current token (see module docstring)."""
    V = len(tok)
    H = 8 * math.ceil(V / 8)
    cfg = Qwen2Config(
        vocab_size=V, hidden_size=H, intermediate_size=16, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=4096, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    ids = tok.convert_tokens_to_ids
    nl = tok.encode("\n")[0]
    L = torch.zeros(V, V)  # L[x, y]: logit of y after x; by default end the turn
    L[:, tok.eos_token_id] = sharp
    for x, y in [("<tool_call>", CALL), (CALL, "</tool_call>"), ("</tool_call>", "<|im_end|>"), (ANSWER, "<|im_end|>")]:
        L[ids(x)] = 0.0
        L[ids(x), ids(y)] = sharp
    L[nl] = 0.0
    L[nl, ids("<tool_call>")] = sharp + math.log(p_call)
    L[nl, ids(ANSWER)] = sharp + math.log(1 - p_call)
    with torch.no_grad():
        # residual stream = one-hot of the current token; the layer adds nothing
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, :V] = torch.eye(V)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, :V] = L.T / math.sqrt(H)  # final RMSNorm scales the one-hot by sqrt(H)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def get_weather(city: str) -> str:
    """Get the current weather of a city.

    Args:
        city: The city name.
    """
    return f'{{"city": "{city}", "condition": "sunny", "temperature": 21}}'


def execution_reward(completions, **_):
    """1 / number of calls (one call is enough), 0 without a call."""
    out = []
    for msgs in completions:
        n = sum(len(m.get("tool_calls") or []) for m in msgs if m["role"] == "assistant")
        out.append(1.0 / n if n else 0.0)
    return out


def summary_reward(completions, **_):
    """1 for the answer grounded in a tool response, 0.5 for the same answer unsupported."""
    out = []
    for msgs in completions:
        final = msgs[-1]
        grounded = any(m["role"] == "tool" for m in msgs)
        said = final["role"] == "assistant" and "sunny" in (final.get("content") or "")
        out.append((1.0 if grounded else 0.5) if said else 0.0)
    return out


def group_norm(r: np.ndarray, G: int) -> np.ndarray:
    """(r - mean) / (std + eps) per block of G, over the non-NaN members; NaN rows and
    groups with fewer than two valid members get 0."""
    out = np.zeros(len(r))
    for s in range(0, len(r), G):
        g = r[s : s + G]
        ok = ~np.isnan(g)
        if ok.sum() >= 2:
            v = g[ok]
            out[s : s + G][ok] = (v - v.mean()) / (v.std(ddof=1) + EPS)
    return out


def dataset(n: int) -> Dataset:
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Weather in Paris? ({i})"}]} for i in range(n)])


def base_args(tmp_path, cls=SLCAGRPOConfig, **kw):
    common = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=96,
        max_steps=1, learning_rate=5e-2, beta=0.0, logging_steps=1, report_to="none", use_cpu=True,
        save_strategy="no", seed=3, temperature=1.0, dataloader_num_workers=0,
    )
    common.update(kw)
    return cls(**common)


def recording(cls):
    class Recording(cls):
        recorded: list[dict] = []

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.recorded.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in out.items()})
            return out

    Recording.recorded = []
    return Recording


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_routing(out: dict, a_tool: np.ndarray, a_sum: np.ndarray, tok) -> None:
    """Tool-call tokens carry a_tool, tool-response tokens 0, tokens after the last response a_sum."""
    ids, cm, tm, adv = out["completion_ids"], out["completion_mask"], out["tool_mask"], out["advantages"]
    assert adv.shape == ids.shape
    call_id = tok.convert_tokens_to_ids("<tool_call>")
    for i in range(ids.shape[0]):
        valid, model_tok = cm[i].bool(), (cm[i] * tm[i]).bool()
        env = valid & ~model_tok
        a = adv[i]
        assert torch.all(a[env] == 0), "tool-response tokens must get no advantage"
        assert torch.all(a[~valid] == 0)
        if env.any():
            b = int(env.nonzero().max())
            pos = torch.arange(len(a))
            tool_tok = model_tok & (pos < b)
            summ_tok = model_tok & (pos > b)
            assert (ids[i][tool_tok] == call_id).any()
            torch.testing.assert_close(a[tool_tok], torch.full_like(a[tool_tok], a_tool[i]), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a[summ_tok], torch.full_like(a[summ_tok], a_sum[i]), atol=1e-5, rtol=1e-5)
        else:  # no call: default empty_tool="both" gives the sum of both advantages
            expect = a_tool[i] + a_sum[i]
            torch.testing.assert_close(a[model_tok], torch.full_like(a[model_tok], expect), atol=1e-5, rtol=1e-5)


def test_contract_holds_and_detects_a_change():
    check_trl_contract()

    class Changed(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids):  # renamed argument
            return None

    with pytest.raises(RuntimeError, match="_calculate_rewards"):
        check_trl_contract(Changed)


@pytest.mark.slow
def test_tool_loop_step_routes_each_advantage_to_its_segment(tmp_path):
    tok = build_tokenizer()
    model = build_policy(tok)
    before = params(model)
    Trainer = recording(SLCAGRPOTrainer)
    trainer = Trainer(
        model=model,
        processing_class=tok,
        reward_funcs=[execution_reward, summary_reward],
        args=base_args(tmp_path, reward_tiers=["tool", "summary"], max_tool_calling_iterations=3),
        train_dataset=dataset(8),
        tools=[get_weather],
    )
    trainer.train()

    out = Trainer.recorded[0]
    ids, cm, tm, adv = out["completion_ids"], out["completion_mask"], out["tool_mask"], out["advantages"]
    assert adv.shape == ids.shape
    # rewards recomputed from the decoded completions, in row order
    texts = [tok.decode(r[m.bool()]) for r, m in zip(ids, cm)]
    n_calls = np.array([t.count("<tool_call>") for t in texts])
    n_resp = np.array([t.count("<tool_response>") for t in texts])
    answered = np.array(["sunny in Paris" in t.split("<tool_response>")[-1].split("</tool_response>")[-1] for t in texts])
    r_tool = np.where(n_calls > 0, 1.0 / np.maximum(n_calls, 1), 0.0)
    r_sum = np.where(answered, np.where(n_resp > 0, 1.0, 0.5), 0.0)
    a_tool, a_sum = group_norm(r_tool, 4), group_norm(r_sum, 4)
    assert (n_resp > 0).any() and (n_calls == 0).any(), texts  # both behaviours in the batch (seeded)

    check_routing(out, a_tool, a_sum, tok)

    logged = trainer.state.log_history[0]
    assert "slca/tool_adv_abs_mean" in logged and logged["slca/tool_token_frac"] > 0
    after = params(trainer.model)
    assert any(not torch.equal(before[n], after[n]) for n in before), "the optimizer step did not move the policy"


def scripted_rollout_func(tok):
    """``rollout_func`` with fixed completions: call / env / answer, with known token spans."""
    call = tok.encode("<tool_call>" + CALL + "</tool_call>") + [tok.eos_token_id]
    env = tok.encode("\n<tool_response>\nsunny\n</tool_response>\nassistant\n")
    answer = tok.encode(ANSWER) + [tok.eos_token_id]
    shapes = [("call", "env", "answer"), ("call", "env", "answer", "answer"), ("answer",), ("call", "env", "call", "env", "answer")]
    parts = {"call": call, "env": env, "answer": answer}

    def rollout_func(prompts, trainer):
        prompt_ids, completion_ids, env_mask, logprobs = [], [], [], []
        offset = len(prompts) * trainer.accelerator.process_index  # other shapes on other processes
        for i, p in enumerate(prompts):
            pids = tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
            seq, mask = [], []
            for part in shapes[(i + offset) % len(shapes)]:
                seq += parts[part]
                mask += [0 if part == "env" else 1] * len(parts[part])
            prompt_ids.append(pids)
            completion_ids.append(seq)
            env_mask.append(mask)
            logprobs.append([0.0] * len(seq))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs, "env_mask": env_mask}

    return rollout_func, parts, shapes


@pytest.mark.slow
def test_rollout_func_env_mask_exact_positions(tmp_path):
    tok = build_tokenizer()
    rollout_func, parts, shapes = scripted_rollout_func(tok)
    r_tool = np.array([1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 1.0, 0.5])
    r_sum = np.array([0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 0.2, 0.9])

    def tool_r(completions, **_):
        return r_tool.tolist()

    def sum_r(completions, **_):
        return r_sum.tolist()

    Trainer = recording(SLCAGRPOTrainer)
    trainer = Trainer(
        model=build_policy(tok),
        processing_class=tok,
        reward_funcs=[sum_r, tool_r],  # order given by reward_tiers
        args=base_args(tmp_path, reward_tiers=["summary", "tool"], shuffle_dataset=False),
        train_dataset=dataset(8),
        rollout_func=rollout_func,
    )
    trainer.train()
    out = Trainer.recorded[0]
    adv = out["advantages"]
    a_tool, a_sum = group_norm(r_tool, 4), group_norm(r_sum, 4)
    for i in range(8):
        expect = []
        shape = shapes[i % 4]
        last_env = max((k for k, p in enumerate(shape) if p == "env"), default=-1)
        for k, part in enumerate(shape):
            n = len(parts[part])
            if part == "env":
                expect += [0.0] * n
            elif last_env < 0:
                expect += [a_tool[i] + a_sum[i]] * n  # no call: empty_tool="both"
            else:
                expect += [a_tool[i] if k < last_env else a_sum[i]] * n
        got = adv[i, : len(expect)]
        torch.testing.assert_close(got, torch.tensor(expect, dtype=got.dtype), atol=1e-5, rtol=1e-5)
        assert torch.all(adv[i, len(expect):] == 0)


def test_grpo_estimator_through_the_trainer_matches_trl_on_policy_tokens(tmp_path):
    """estimator="grpo" reproduces TRL's own advantage on model tokens (tool-result tokens get 0)."""
    tok = build_tokenizer()
    rollout_func, _, _ = scripted_rollout_func(tok)
    rng = np.random.default_rng(0)
    r1, r2 = rng.random(8), rng.random(8)
    funcs = [lambda completions, **_: r1.tolist(), lambda completions, **_: r2.tolist()]
    for f, name in zip(funcs, ["r1", "r2"]):
        f.__name__ = name
    results = {}
    for cls, extra in [(GRPOTrainer, {}), (SLCAGRPOTrainer, {"advantage_estimator": "grpo"})]:
        Trainer = recording(cls)
        t = Trainer(
            model=build_policy(tok), processing_class=tok, reward_funcs=funcs,
            args=base_args(tmp_path, cls=GRPOConfig if cls is GRPOTrainer else SLCAGRPOConfig, shuffle_dataset=False, **extra),
            train_dataset=dataset(8), rollout_func=rollout_func,
        )
        results[cls.__name__] = t._generate_and_score_completions([dict(x) for x in t.train_dataset])
    trl_out, slca_out = results["GRPOTrainer"], results["SLCAGRPOTrainer"]
    model_tok = (trl_out["completion_mask"] * trl_out["tool_mask"]).float()
    torch.testing.assert_close(slca_out["advantages"], trl_out["advantages"].unsqueeze(1) * model_tok, atol=1e-5, rtol=1e-5)


def test_gathered_batch_then_local_slice_equals_per_process_padding():
    """Two "processes" with different padding: normalising the gathered batch and slicing keeps each row's values."""
    g = torch.Generator().manual_seed(0)
    B, G = 8, 4
    rpf = torch.rand(B, 2, generator=g)
    lens = [9, 7, 12, 5, 6, 11, 8, 10]
    T = max(lens)
    cm = torch.zeros(B, T, dtype=torch.long)
    tm = torch.ones(B, T, dtype=torch.long)
    for i, n in enumerate(lens):
        cm[i, :n] = 1
        tm[i, 2:4] = 0 if i % 3 else 1  # every third row made no call
    full, _ = trl_batch_advantages(rpf, ["tool", "summary"], torch.ones(2), cm, tm, G)
    # process 1 holds rows 4..7 padded only to its own max length
    T1 = max(lens[4:])
    local = full[4:8, :T1]
    assert torch.all(full[4:8, T1:] == 0)
    single, _ = trl_batch_advantages(rpf[4:8], ["tool", "summary"], torch.ones(2), cm[4:8, :T1], tm[4:8, :T1], G)
    torch.testing.assert_close(local, single)  # rows 4..7 are one whole group


def test_tier_rewards_weights_and_nan():
    r = torch.tensor([[1.0, 2.0, float("nan")], [float("nan"), 1.0, float("nan")]])
    tool, summ = tier_rewards(r, ["tool", "summary", "tool"], torch.tensor([2.0, 1.0, 1.0]))
    assert tool[0].item() == 2.0 and math.isnan(tool[1].item())
    assert summ.tolist() == [2.0, 1.0]
    with pytest.raises(ValueError, match="reward_tiers"):
        tier_rewards(r, ["tool", "summary"], torch.ones(2))


def test_bad_tiers_are_rejected(tmp_path):
    tok = build_tokenizer()
    with pytest.raises(ValueError, match="reward_tiers"):
        SLCAGRPOTrainer(
            model=build_policy(tok), processing_class=tok, reward_funcs=[execution_reward],
            args=base_args(tmp_path, reward_tiers=["tool", "summary"]), train_dataset=dataset(8),
        )


MULTI_PROCESS_SCRIPT = """
import sys
import torch
sys.path.insert(0, {tests!r})
from test_integration_trl import base_args, build_policy, build_tokenizer, dataset, recording, scripted_rollout_func
from slca.integrations.trl import SLCAGRPOTrainer

tok = build_tokenizer()
rollout_func, _, _ = scripted_rollout_func(tok)

def tool_r(completions, completion_ids, **_):
    return [len(c) / 10.0 for c in completion_ids]

def sum_r(completions, completion_ids, **_):
    return [float(sum(c) % 7) for c in completion_ids]

Trainer = recording(SLCAGRPOTrainer)
t = Trainer(model=build_policy(tok), processing_class=tok, reward_funcs=[tool_r, sum_r],
            args=base_args({out!r}, per_device_train_batch_size=2, num_generations=4, shuffle_dataset=False),
            train_dataset=dataset(4), rollout_func=rollout_func)
t.train()
rec = Trainer.recorded[0]
torch.save({{k: rec[k] for k in ("completion_ids", "completion_mask", "tool_mask", "advantages")}},
           {out!r} + f"/rank{{t.accelerator.process_index}}.pt")

# an estimator's own inputs are computed per process and gathered in row order (ragged tensors padded with NaN)
import os
import slca.core.registry as A
seen = {{}}

@A.register_estimator("gather_probe", needs=(A.InputSpec("probe_rows", "(B, K)"), A.InputSpec("probe_ids", "ids")))
def gather_probe(inputs, *, scale="group", eps=1e-6):
    seen.update(rows=inputs.get("probe_rows").cpu(), ids=list(inputs.get("probe_ids")))
    return A.compute_advantages("slca", inputs, scale=scale, eps=eps)

rank = int(os.environ["RANK"])
def probe_rows(completion_ids, **_):  # K = 1 on rank 0, 2 on rank 1
    return torch.tensor([[100.0 * rank + i] * (1 + rank) for i in range(len(completion_ids))])
def probe_ids(completion_ids, **_):
    return [f"{{rank}}:{{i}}" for i in range(len(completion_ids))]

t2 = SLCAGRPOTrainer(model=build_policy(tok), processing_class=tok, reward_funcs=[tool_r, sum_r],
                     args=base_args({out!r}, per_device_train_batch_size=2, num_generations=4, shuffle_dataset=False,
                                    advantage_estimator="gather_probe"),
                     train_dataset=dataset(4), rollout_func=rollout_func,
                     estimator_inputs={{"probe_rows": probe_rows, "probe_ids": probe_ids}})
t2.train()
torch.save(seen, {out!r} + f"/probe{{rank}}.pt")
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_normalise_a_group_split_across_them(tmp_path):
    """torchrun, 2 CPU processes (accelerate picks gloo): one group of 4 split 2 + 2, different padding per process."""
    script = tmp_path / "run.py"
    script.write_text(MULTI_PROCESS_SCRIPT.format(tests=os.path.dirname(__file__), out=str(tmp_path)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()), str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, textwrap.shorten(r.stderr[-3000:], 3000)
    ranks = [torch.load(tmp_path / f"rank{k}.pt") for k in (0, 1)]
    assert ranks[0]["completion_ids"].shape[1] != ranks[1]["completion_ids"].shape[1]  # padded differently
    ids = [row[m.bool()].tolist() for rk in ranks for row, m in zip(rk["completion_ids"], rk["completion_mask"])]
    a_tool = group_norm(np.array([len(c) / 10.0 for c in ids]), 4)
    a_sum = group_norm(np.array([float(sum(c) % 7) for c in ids]), 4)
    row = 0
    for rk in ranks:
        for i in range(rk["advantages"].shape[0]):
            cm, tm, adv = rk["completion_mask"][i].bool(), rk["tool_mask"][i].bool(), rk["advantages"][i]
            model_tok, env = cm & tm, cm & ~tm
            b = int(env.nonzero().max()) if env.any() else -1
            pos = torch.arange(len(adv))
            expect = torch.zeros_like(adv)
            if b < 0:
                expect[model_tok] = a_tool[row] + a_sum[row]  # no call: empty_tool="both"
            else:
                expect[model_tok & (pos < b)] = float(a_tool[row])
                expect[model_tok & (pos > b)] = float(a_sum[row])
            torch.testing.assert_close(adv, expect, atol=1e-5, rtol=1e-5)
            row += 1
    nan = float("nan")
    for k in (0, 1):  # every process sees the whole batch's inputs, in row order
        seen = torch.load(tmp_path / f"probe{k}.pt")
        torch.testing.assert_close(seen["rows"], torch.tensor([[0.0, nan], [1.0, nan], [100.0, 100.0], [101.0, 101.0]]),
                                   equal_nan=True)
        assert seen["ids"] == ["0:0", "0:1", "1:0", "1:1"]


def test_simulator_environment_exposes_task_tools_and_answers_from_slca():
    from transformers.utils import get_json_schema

    from slca.env.toolworld import make_env, make_tasks
    from slca.integrations.trl import simulator_environment

    tasks = {t.id: t for t in make_tasks("train", n=30)}
    Env = simulator_environment(tasks, make_env)
    task = next(t for t in tasks.values() if t.gold)
    env = Env()
    env.reset(task_id=task.id, prompt=task.messages)
    call = task.gold[0][0]
    schema = get_json_schema(getattr(env, call.name))["function"]
    spec = next(t["function"] for t in task.tools if t["function"]["name"] == call.name)
    assert schema["name"] == call.name
    assert set(schema["parameters"]["required"]) == set(spec["parameters"].get("required", []))
    assert getattr(env, call.name)(**call.arguments) == make_env(task).call(call.name, call.arguments).to_text()
    assert "error" in getattr(env, call.name)()  # missing arguments: a readable error, not an exception
    with pytest.raises(ValueError, match="task_id"):
        env.reset(task_id="nope")


@pytest.mark.slow
def test_environment_factory_step_with_slca_rewards(tmp_path):
    """TRL's environment_factory loop on slca's toolworld simulator, scored by slca.rewards."""
    from slca.env.toolworld import make_env, make_tasks
    from slca.integrations.trl import simulator_environment, slca_reward_funcs

    tasks = {t.id: t for t in make_tasks("train", n=8) if t.gold}
    ds = Dataset.from_list([{"prompt": t.messages, "task_id": i} for i, t in tasks.items()][:2])
    seen: dict[str, list] = {"slca_execution": [], "slca_summary": []}

    def recorded(f):
        def g(completions, **kw):
            r = f(completions, **kw)
            seen[f.__name__].append(r)
            return r

        g.__name__ = f.__name__
        return g

    tok = build_tokenizer()
    Trainer = recording(SLCAGRPOTrainer)
    trainer = Trainer(
        model=build_policy(tok), processing_class=tok,
        reward_funcs=[recorded(f) for f in slca_reward_funcs(tasks, unanswered="unscored")],
        args=base_args(tmp_path, max_tool_calling_iterations=2, seed=5, max_completion_length=512),
        train_dataset=ds, environment_factory=simulator_environment(tasks, make_env),
    )
    trainer.train()
    r_tool = np.array(seen["slca_execution"][0], dtype=float)
    r_sum = np.array(seen["slca_summary"][0], dtype=float)
    # rollouts that hit the turn limit with an unanswered call are unscorable (None -> NaN in TRL):
    # left out of their group's statistics, advantage 0
    assert np.isfinite(r_tool).sum() >= 2 and np.isfinite(r_sum).sum() >= 2
    out = Trainer.recorded[0]
    assert (out["tool_mask"] == 0).any()  # the simulator answered some calls
    check_routing(out, group_norm(r_tool, 4), group_norm(r_sum, 4), tok)


@pytest.mark.slow
def test_example_runs_as_shipped_on_cpu_with_the_embedded_model(tmp_path):
    """examples/trl/train_slca_trl.py, unchanged, on CPU: TrlParser flags, the embedded model (built at the tiny
    test size), its chat template through TRL's tool loop, slca's simulator per rollout, one optimizer step."""
    from test_warmstart_build import TINY
    from transformers import AutoTokenizer

    from slca.models import default_model_dir, load_default

    _, tok = load_default(tmp_path / "cache", config=TINY, progress=False)
    assert tok.response_template is not None  # what TRL's tool loop parses generated turns with
    path = default_model_dir(tmp_path / "cache", TINY)
    assert AutoTokenizer.from_pretrained(path).response_template == tok.response_template  # saved by the build
    script = os.path.join(os.path.dirname(__file__), "..", "examples", "trl", "train_slca_trl.py")
    cmd = [sys.executable, script, "--model", str(path), "--output_dir", str(tmp_path / "run"), "--use_cpu", "--bf16",
           "false", "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "4",
           "--max_completion_length", "64", "--max_tool_calling_iterations", "2", "--report_to", "none",
           "--save_strategy", "no", "--logging_steps", "1", "--n_tasks", "8", "--advantage_estimator", "slca"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "slca/tool_token_frac" in r.stdout + r.stderr
    assert "[slca] process 0 of 1: train advantages of rows 0-3 of 4 by advantage_estimator='slca'" in r.stdout


ROOT = os.path.join(os.path.dirname(__file__), "..")
TWO_CPU_PROCESSES = "accelerate launch --multi_gpu --num_processes 2 examples/trl/train_slca_trl.py"
LAUNCH_LINE = re.compile(r"\[slca\] process (\d) of (\d+): train advantages of rows (\d+)-(\d+) of (\d+) "
                         r"by advantage_estimator='([^']*)'; (\d+) steps")


def documented_command(doc: str, start: str) -> list[str]:
    """The shell command of ``doc`` that begins with ``start`` (continuation lines joined), as tokens."""
    lines = open(os.path.join(ROOT, doc)).read().splitlines()
    i = next((k for k, ln in enumerate(lines) if ln.strip().startswith(start)), None)
    assert i is not None, f"{doc} has no command starting {start!r}"
    cmd = lines[i].strip()
    while cmd.endswith("\\"):
        i += 1
        cmd = cmd[:-1] + " " + lines[i].strip()
    return shlex.split(cmd)


EACH_ESTIMATOR = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("train_slca_trl", {script!r})
example = sys.modules["train_slca_trl"] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up there)
spec.loader.exec_module(example)
for name in {names!r}:  # one trainer after another in the same two processes (one process group)
    example.main(sys.argv[1:] + ["--output_dir", {out!r} + "/" + name, "--advantage_estimator", name])
"""


def _launch(tmp_path, script: str, *extra: str) -> subprocess.CompletedProcess:
    """docs/integrations.md's two-process CPU command as a user types it (the embedded model, gloo), one step, with
    ``script`` in the place of the example's path."""
    from slca.models.default import resolve_default_dir

    shipped, missing = resolve_default_dir()
    assert not missing, f"the embedded model's shipped weights are not used here ({shipped}): the run would build it"
    cmd = documented_command("docs/integrations.md", TWO_CPU_PROCESSES)
    assert cmd[:2] == ["accelerate", "launch"] and cmd[5] == "examples/trl/train_slca_trl.py"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", "0", *cmd[2:5], script, *cmd[6:],
           "--max_steps", "1", "--save_strategy", "no", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


def _trained_on_two_processes(stdout: str, out, name: str) -> None:
    """Both processes kept their rows of the one gathered batch, the estimator named is the one the advantages came
    from, the loss is finite and the saved policy moved."""
    from safetensors.torch import load_file

    from slca.models.default import resolve_default_dir

    seen = sorted(tuple(int(g) if g.isdigit() else g for g in m) for m in LAUNCH_LINE.findall(stdout) if m[5] == name)
    assert [s[0] for s in seen] == [0, 1], (name, stdout[-3000:])  # one line from each process
    (_, n0, a0, b0, total, est0, steps0), (_, n1, a1, b1, total1, est1, steps1) = seen
    assert n0 == n1 == 2 and est0 == est1 == name and steps0 == steps1 == 1
    half = total // 2  # one gathered batch; process 0 kept its first half, process 1 the second
    assert total1 == total and (a0, b0, a1, b1) == (0, half - 1, half, total - 1), seen

    state = json.loads((out / "trainer_state.json").read_text())
    step = next(h for h in state["log_history"] if "loss" in h)
    assert math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"]), (name, step)
    assert "slca/tool_adv_abs_mean" in step  # the advantages were slca's (its metrics are logged where it computes them)
    before, after = load_file(resolve_default_dir()[0] / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(after) <= set(before) and all(torch.isfinite(t).all() for t in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in after), f"{name}: the optimizer step did not move the policy"


@pytest.mark.slow
def test_accelerate_launch_of_the_documented_command_trains_on_two_cpu_processes(tmp_path):
    """The documented command, the example's script itself, with slca: one step on two gloo ranks."""
    out = tmp_path / "run"
    r = _launch(tmp_path, "examples/trl/train_slca_trl.py", "--output_dir", str(out), "--advantage_estimator", "slca")
    _trained_on_two_processes(r.stdout, out, "slca")


@pytest.mark.slow
def test_every_registered_estimator_trains_on_two_cpu_processes_under_accelerate_launch(tmp_path):
    """The same launch with every other registered estimator, one after another in the same two processes (the example's
    ``main`` called once per estimator: a process pair costs ~30 CPU s of imports, a trainer in it a few)."""
    names = [n for n in BUILTIN_ESTIMATORS if n != "slca"]
    driver = tmp_path / "each_estimator.py"
    driver.write_text(EACH_ESTIMATOR.format(script=os.path.join(ROOT, "examples", "trl", "train_slca_trl.py"), names=names,
                                            out=str(tmp_path)))
    r = _launch(tmp_path, str(driver))
    for name in names:
        _trained_on_two_processes(r.stdout, tmp_path / name, name)


def test_single_summary_function_grpo_equals_trl_and_absent_tiers_are_defined():
    """The issue's case: one reward function, estimator grpo -> TRL's advantages (was all 0)."""
    r = torch.tensor([[1.0], [0.0], [0.5], [0.2]])
    mask = torch.ones(4, 3)
    expect = torch.tensor(group_norm(r[:, 0].numpy(), 4), dtype=torch.float32)
    for est in ("grpo", "slca", "gdpo"):
        adv, _ = trl_batch_advantages(r, ["summary"], torch.ones(1), mask, None, 4, estimator=est)
        torch.testing.assert_close(adv, expect.unsqueeze(1).expand(4, 3), atol=1e-5, rtol=1e-5)
    # summary tier only, with a call in row 0: its call tokens get nothing, its answer the summary advantage
    tm = torch.ones(4, 3, dtype=torch.long)
    tm[0, 1] = 0  # tokens: call, tool response, answer
    adv, _ = trl_batch_advantages(r, ["summary"], torch.ones(1), mask, tm, 4, estimator="slca")
    assert adv[0].tolist() == pytest.approx([0.0, 0.0, float(expect[0])], abs=1e-5)
    # no tool tier: empty_tool is 'include' whatever the options say (no execution advantage to mix in)
    for mode in ("response", "exclude"):
        same, _ = trl_batch_advantages(r, ["summary"], torch.ones(1), mask, tm, 4, estimator="slca", options={"empty_tool": mode})
        torch.testing.assert_close(same, adv)
    # no summary-tier function: a tiered estimator refuses, grpo takes it
    with pytest.raises(ValueError, match="summary"):
        trl_batch_advantages(r, ["tool"], torch.ones(1), mask, None, 4, estimator="slca")
    adv, _ = trl_batch_advantages(r, ["tool"], torch.ones(1), mask, None, 4, estimator="grpo")
    torch.testing.assert_close(adv[:, 0], expect, atol=1e-5, rtol=1e-5)


def test_a_registered_trajectory_estimator_gets_trls_scalar_and_needs_no_summary_tier(monkeypatch):
    """The registry's ``trajectory`` flag, not a list of names in the adapter, decides how TRL's rewards reach an estimator."""
    import slca.core.registry as adv_mod
    from slca.core.advantages import grpo_advantages

    monkeypatch.setattr(adv_mod, "_REGISTRY", dict(adv_mod._REGISTRY))

    @adv_mod.register_estimator("doubled_grpo", trajectory=True)
    def _doubled(inputs, *, scale="group", eps=1e-6):
        return 2 * grpo_advantages(inputs.total_rewards, inputs.group_ids, inputs.model_mask, scale=scale, eps=eps)

    nan = float("nan")
    r = torch.tensor([[1.0, nan], [nan, 0.5], [0.5, 0.2], [0.2, 0.0]])
    mask = torch.ones(4, 3)
    grpo, _ = trl_batch_advantages(r, ["tool", "summary"], torch.ones(2), mask, None, 4, estimator="grpo")
    doubled, _ = trl_batch_advantages(r, ["tool", "summary"], torch.ones(2), mask, None, 4, estimator="doubled_grpo")
    torch.testing.assert_close(doubled, 2 * grpo)
    trl_batch_advantages(r[:, :1], ["tool"], torch.ones(1), mask, None, 4, estimator="doubled_grpo")  # no summary tier needed
    assert adv_mod.get_estimator("grpo").trajectory and not adv_mod.get_estimator("slca").trajectory


def test_none_rows_are_summed_like_trl_for_grpo_and_left_out_per_tier_for_slca():
    nan = float("nan")
    rpf = torch.tensor([[1.0, 0.2], [nan, 0.9], [0.0, nan], [0.5, 0.4], [nan, nan], [1.0, 1.0], [0.0, 0.0], [0.3, 0.1]])
    mask = torch.ones(8, 2)
    adv, _ = trl_batch_advantages(rpf, ["tool", "summary"], torch.tensor([1.0, 2.0]), mask, None, 4, estimator="grpo")
    total = np.nansum(rpf.numpy() * np.array([1.0, 2.0]), axis=1)
    total[4] = np.nan  # TRL: only a row no function scored is left out
    torch.testing.assert_close(adv[:, 0], torch.tensor(group_norm(total, 4), dtype=torch.float32), atol=1e-5, rtol=1e-5)
    adv, _ = trl_batch_advantages(rpf, ["tool", "summary"], torch.tensor([1.0, 2.0]), mask, None, 4, estimator="slca")
    a_t = group_norm(rpf[:, 0].numpy(), 4)
    a_s = group_norm(rpf[:, 1].numpy() * 2, 4)
    torch.testing.assert_close(adv[:, 0], torch.tensor(a_t + a_s, dtype=torch.float32), atol=1e-5, rtol=1e-5)  # no call: "both"


@pytest.mark.parametrize("name", BUILTIN_ESTIMATORS)
def test_normalize_then_sum_is_taken_by_grpo_and_refused_with_the_reason_by_tiered_estimators(tmp_path, name):
    tok = build_tokenizer()
    kw = dict(model=build_policy(tok), processing_class=tok, reward_funcs=[execution_reward, summary_reward],
              args=base_args(tmp_path, advantage_estimator=name, multi_objective_aggregation="normalize_then_sum"),
              train_dataset=dataset(8), estimator_inputs={n: (lambda **_: None) for n in get_estimator(name).needs})
    if get_estimator(name).trajectory:
        assert SLCAGRPOTrainer(**kw).slca_aggregation == "normalize_then_sum"
    else:
        with pytest.raises(ValueError, match=f"normalize_then_sum' with advantage_estimator='{name}'.*nothing to route"):
            SLCAGRPOTrainer(**kw)


# ----------------------------------------------------------------- every registered estimator through the trainer

OPTIONS = {"slca_turn": {"turn_lambda": 0.5}, "slca_cond": {"cond_std": "subgroup"}, "call_count_bonus": {"weight": 0.5},
           "slca_paper": {"lambda_sum": 0.5}, "toolpo_grpo": {"toolpo_lambda": 0.5}}


def flaky_weather():
    """A ``get_weather`` tool that fails every other call, so tool outcomes (and turn scores) differ between rollouts."""
    import itertools

    calls = itertools.count()

    def get_weather(city: str) -> str:
        """Get the current weather of a city.

        Args:
            city: The city name.
        """
        if next(calls) % 2:
            return '{"error": "service unavailable"}'
        return f'{{"city": "{city}", "condition": "sunny", "temperature": 21}}'

    return get_weather


def weather_task(tool):
    from transformers.utils import get_json_schema

    from slca.types import Task, ToolCall

    return Task(id="weather", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[get_json_schema(tool)],
                gold=[[ToolCall("get_weather", {"city": "Paris"})]], answer_facts=["sunny"])


def register_call_count_bonus(monkeypatch):
    """A user's estimator with an input of its own (computed from slca trajectories): SLCA plus the group-normalised
    number of calls on the tool tokens."""
    import slca.core.registry as adv_mod
    from slca.core.advantages import group_normalize

    monkeypatch.setattr(adv_mod, "_REGISTRY", dict(adv_mod._REGISTRY))
    monkeypatch.setattr(adv_mod, "_INPUTS", dict(adv_mod._INPUTS))
    counts = adv_mod.InputSpec("call_counts", "(B,) number of tool calls of each rollout",
                               lambda trajs: torch.tensor([float(sum(len(c) for c in t.calls)) for t in trajs]))

    @adv_mod.register_estimator("call_count_bonus", needs=(counts,))
    def call_count_bonus(inputs, *, scale="group", eps=1e-6, weight=1.0):
        base = adv_mod.compute_advantages("slca", inputs, scale=scale, eps=eps)
        bonus = group_normalize(inputs.get("call_counts"), inputs.group_ids, scale=scale, eps=eps)
        return base + weight * bonus.unsqueeze(1) * inputs.tool_mask.float()


def hand_inputs(texts):
    """Rewards and needed inputs recomputed by hand from the decoded completions (every call is get_weather(Paris))."""
    n_calls = np.array([t.count("<tool_call>") for t in texts])
    bodies = [[r.split("</tool_response>")[0] for r in t.split("<tool_response>")[1:]] for t in texts]
    oks = [["error" not in b for b in bs] for bs in bodies]
    answered = np.array(["sunny in Paris" in t.split("</tool_response>")[-1] for t in texts])
    r_tool = np.where(n_calls > 0, 1.0 / np.maximum(n_calls, 1), 0.0)
    r_sum = np.where(answered, np.where([len(b) > 0 for b in bodies], 1.0, 0.5), 0.0)
    K = max(int(n_calls.max()), 1)
    turns = np.full((len(texts), K), np.nan)  # gold is one call: the first successful call scores 1, any other 0
    for i, ok in enumerate(oks):
        done = False
        for k in range(n_calls[i]):
            if k < len(ok):  # an unanswered call (the loop's last) scores NaN
                turns[i, k] = 1.0 if ok[k] and not done else 0.0
                done = done or ok[k]
    signatures = [tuple(sorted(ok)) for ok in oks]  # every call has one key: the multiset of outcomes
    called = (n_calls > 0).astype(np.float32)
    paper = {  # the released estimators' inputs (slca.rewards.paper): gold is one call, every call is that call
        "should_no_call": 1.0 - called, "toolpo_correct_ratio": called, "rltr_comp": called,
        "rltr_repeat_penalty": -0.1 * np.maximum(n_calls - 1, 0), "rltr_error_penalty": np.zeros(len(texts)),
        "rltr_format_valid": np.ones(len(texts)),
    }
    return r_tool, r_sum, n_calls, signatures, turns, {k: torch.tensor(v, dtype=torch.float32) for k, v in paper.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN_ESTIMATORS + ["call_count_bonus"])
def test_every_registered_estimator_takes_a_trainer_step_with_its_inputs(tmp_path, monkeypatch, name):
    """Each estimator of the registry (and a user's, with an input of its own) through TRL's tool loop for one
    step: the inputs it needs are computed from the completions, its options come from SLCAGRPOConfig, the
    policy moves, and the advantages equal the estimator's on inputs recomputed here by hand."""
    from slca import AdvantageInputs, compute_advantages, segment_masks

    if name == "call_count_bonus":
        register_call_count_bonus(monkeypatch)
    tool = flaky_weather()
    task = weather_task(tool)
    tok = build_tokenizer()
    model = build_policy(tok)
    before = params(model)
    Trainer = recording(SLCAGRPOTrainer)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Weather in Paris? ({i})"}], "task_id": "weather"}
                            for i in range(16)])
    trainer = Trainer(
        model=model, processing_class=tok, reward_funcs=[execution_reward, summary_reward],
        args=base_args(tmp_path, advantage_estimator=name, estimator_options=OPTIONS.get(name),
                       max_tool_calling_iterations=3, per_device_train_batch_size=16),
        train_dataset=ds, tools=[tool], tasks={"weather": task},
    )
    trainer.train()
    after = params(trainer.model)
    moved = any(not torch.equal(before[n], after[n]) for n in before)

    out = Trainer.recorded[0]
    ids, cm, tm, adv = out["completion_ids"], out["completion_mask"], out["tool_mask"], out["advantages"]
    texts = [tok.decode(r[m.bool()]) for r, m in zip(ids, cm)]
    r_tool, r_sum, n_calls, signatures, turns, paper = hand_inputs(texts)
    assert len(set(signatures)) > 1 and (n_calls == 0).any(), texts  # outcomes differ (seeded)
    model_tok = cm * tm
    tool_seg, sum_seg = segment_masks(model_tok, cm)
    inputs = AdvantageInputs(
        torch.tensor(r_tool), torch.tensor(r_sum), torch.arange(16) // 4, model_tok, tool_seg, sum_seg,
        tool_signatures=signatures, turn_rewards=torch.tensor(turns), extra={"call_counts": torch.tensor(n_calls), **paper},
    )
    if "span_labels" in get_estimator(name).needs:  # slca_think: the labels of the completion ids, as the trainer makes them
        from slca.chat.spans import span_labels

        lengths = [int(torch.nonzero(m).max()) + 1 if m.any() else 0 for m in cm]
        inputs = inputs.with_inputs({"span_labels": span_labels(ids, model_tok, tokenizer=tok, fmt="hermes",
                                                                end_of_turn=trainer._turn_ends(), lengths=lengths)})
    host = get_estimator(name).pick({"scale": "group", "eps": EPS})  # empty_tool / empty_summary: the defaults
    expect = compute_advantages(name, inputs, **host, **OPTIONS.get(name, {}))
    # rltr_planner may leave the policy where it was on this batch: its only groups with two process segments
    # hold a rollout with one call and an answer and one with the same call repeated and cut, whose first calls
    # are the same tokens after the same prompt; the positional segments make that first call the whole process
    # segment of both (the repeat is the second one's "summary", which RLTR leaves at 0), so the two advantages
    # (+a, -a) on identical tokens cancel in the gradient exactly
    assert moved or name == "rltr_planner", "the optimizer step did not move the policy"
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(adv, expect, atol=1e-5, rtol=1e-5)
    assert torch.all(adv[(cm * (1 - tm)).bool()] == 0) and torch.all(adv[~cm.bool()] == 0)  # tool responses, padding
    if name in OPTIONS:  # the estimator's own option and input changed something: not plain SLCA
        plain = compute_advantages("slca", inputs, scale="group", eps=EPS)
        assert not torch.allclose(adv, plain, atol=1e-4)


def test_span_segmentation_and_slca_think_through_the_batch_function(tmp_path):
    """trl_batch_advantages with segmentation='span': the advantages are slca's on the span segments; slca_think with
    the reasoning reward inherited equals slca; without labels, and with a format that has no call spans, refused."""
    from slca import compute_advantages, segment_masks
    from slca.core.segments import SPAN_CALL, SPAN_TEXT, SPAN_THINK, span_segment_masks

    B, T = 8, 6
    g = torch.Generator().manual_seed(0)
    rpf = torch.rand(B, 2, generator=g)
    valid = torch.ones(B, T, dtype=torch.long)
    env = torch.tensor([[1, 1, 1, 0, 1, 1]] * B)  # a tool turn, a tool result, the answer
    labels = torch.tensor([[SPAN_THINK, SPAN_TEXT, SPAN_CALL, 0, SPAN_TEXT, SPAN_TEXT]] * B, dtype=torch.int8)
    w = torch.tensor([1.0, 1.0])
    adv, used = trl_batch_advantages(rpf, ["tool", "summary"], w, valid, env, 4, segmentation="span", span_labels=labels)
    tm, sm = span_segment_masks(*segment_masks(env, valid), labels)
    assert torch.equal(used.tool_mask, tm) and torch.equal(used.summary_mask, sm) and tm[0].tolist() == [1, 0, 1, 0, 0, 0]
    assert torch.equal(adv, compute_advantages("slca", used, eps=EPS))
    assert torch.equal(adv[:, 1], adv[:, 4])  # the text in the tool turn has the answer's advantage
    think, _ = trl_batch_advantages(rpf, ["tool", "summary"], w, valid, env, 4, estimator="slca_think", span_labels=labels)
    plain, _ = trl_batch_advantages(rpf, ["tool", "summary"], w, valid, env, 4)
    assert torch.equal(think, plain)
    with pytest.raises(ValueError, match="needs span_labels"):
        trl_batch_advantages(rpf, ["tool", "summary"], w, valid, env, 4, segmentation="span")
    with pytest.raises(ValueError, match="segmentation='span' needs each policy token labelled.*'openai'"):
        base_args(tmp_path, segmentation="span", tool_format="openai")
    with pytest.raises(ValueError, match="segmentation must be one of"):
        base_args(tmp_path, segmentation="turns")


def test_slca_think_labels_the_completions_itself(tmp_path):
    tok = build_tokenizer()
    kw = dict(model=build_policy(tok), processing_class=tok, reward_funcs=[execution_reward, summary_reward],
              train_dataset=dataset(8))
    t = SLCAGRPOTrainer(args=base_args(tmp_path, advantage_estimator="slca_think"), **kw)
    assert t.slca_spans and t.slca_input_funcs == {}
    with pytest.raises(ValueError, match="may not give 'span_labels': the trainer labels the completion ids itself"):
        SLCAGRPOTrainer(args=base_args(tmp_path, advantage_estimator="slca_think"), estimator_inputs={"span_labels": lambda **_: None}, **kw)


def test_needed_inputs_and_options_are_checked_when_the_trainer_is_built(tmp_path):
    tok = build_tokenizer()
    kw = dict(model=build_policy(tok), processing_class=tok, reward_funcs=[execution_reward, summary_reward],
              train_dataset=dataset(8))
    with pytest.raises(ValueError, match=r"needs the input 'turn_rewards'.*pass tasks="):
        SLCAGRPOTrainer(args=base_args(tmp_path, advantage_estimator="slca_turn"), **kw)
    with pytest.raises(ValueError, match="estimator 'slca_turn' has no option 'lambda'"):
        SLCAGRPOTrainer(args=base_args(tmp_path, advantage_estimator="slca_turn", estimator_options={"lambda": 1.0}),
                        estimator_inputs={"turn_rewards": lambda **_: None}, **kw)
    with pytest.raises(ValueError, match="option 'turn_lambda' must be float"):
        SLCAGRPOTrainer(args=base_args(tmp_path, advantage_estimator="slca_turn", estimator_options={"turn_lambda": "x"}),
                        estimator_inputs={"turn_rewards": lambda **_: None}, **kw)
    with pytest.raises(ValueError, match="may not set 'scale': it comes from SLCAGRPOConfig.scale_rewards"):
        SLCAGRPOTrainer(args=base_args(tmp_path, estimator_options={"scale": "none"}), **kw)
    with pytest.raises(ValueError, match="are not inputs advantage_estimator='slca' needs"):
        SLCAGRPOTrainer(args=base_args(tmp_path), estimator_inputs={"turn_rewards": lambda **_: None}, **kw)


def test_slca_loss_aggregations_given_as_trl_loss_type_are_refused_in_one_line(tmp_path):
    """TRL aggregates the loss: slca's per-segment and per-turn modes have no TRL loss type, its others have TRL names."""
    for mode in ("turn_mean", "segment_balanced"):
        with pytest.raises(ValueError, match=rf"^loss_type='{mode}': TRL's GRPOTrainer aggregates the loss itself.*"
                                             rf"never by segments or turns.*loss_agg={mode}") as e:
            base_args(tmp_path, loss_type=mode)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="loss_type='seq_mean' is slca's loss_agg name; .* is loss_type='grpo'"):
        base_args(tmp_path, loss_type="seq_mean")
    assert base_args(tmp_path, loss_type="bnpo").loss_type == "bnpo"  # TRL's own names are TRL's to check
    tok = build_tokenizer()  # a plain GRPOConfig is not checked when made: the trainer refuses it
    with pytest.raises(ValueError, match="^loss_type='turn_mean': TRL's GRPOTrainer"):
        SLCAGRPOTrainer(model=build_policy(tok), processing_class=tok, reward_funcs=[execution_reward, summary_reward],
                        args=base_args(tmp_path, cls=GRPOConfig, loss_type="turn_mean"), train_dataset=dataset(8))


def test_estimator_options_parse_from_the_command_line():
    from trl import TrlParser

    (args,) = TrlParser((SLCAGRPOConfig,)).parse_args_and_config(
        args=["--output_dir", "x", "--advantage_estimator", "slca_turn", "--estimator_options", '{"turn_lambda": 0.25}',
              "--use_cpu", "--bf16", "false"])
    assert args.advantage_estimator == "slca_turn" and args.estimator_options == {"turn_lambda": 0.25}


def test_deprecated_empty_tool_and_empty_summary_fields_warn_and_travel_in_estimator_options(tmp_path):
    """SLCAGRPOConfig.empty_tool / .empty_summary (before issue 46): a FutureWarning naming estimator_options, and the
    value routed there; given both ways with different values, one line; grpo, which takes neither, ignores them as
    before, but a bad value is still refused."""
    with pytest.warns(FutureWarning, match=r"^SLCAGRPOConfig.empty_tool is deprecated: pass "
                                           r"estimator_options=\{'empty_tool': 'exclude'\} instead$"):
        cfg = base_args(tmp_path, empty_tool="exclude", estimator_options={"empty_summary": "drop"})
    assert cfg.estimator_options == {"empty_tool": "exclude", "empty_summary": "drop"}
    with pytest.warns(FutureWarning, match=r"SLCAGRPOConfig.empty_summary is deprecated: pass estimator_options="):
        cfg = base_args(tmp_path, advantage_estimator="slca_turn", empty_summary="drop", estimator_options={"empty_summary": "drop"})
    assert cfg.estimator_options == {"empty_summary": "drop"}  # the same value both ways: no conflict
    with pytest.raises(ValueError) as e:
        base_args(tmp_path, empty_tool="exclude", estimator_options={"empty_tool": "include"})
    assert str(e.value) == ("SLCAGRPOConfig.empty_tool='exclude' and estimator_options empty_tool='include' disagree: "
                            "set empty_tool in estimator_options only (SLCAGRPOConfig.empty_tool is deprecated)")
    with pytest.warns(FutureWarning, match="SLCAGRPOConfig.empty_tool is deprecated"):
        assert base_args(tmp_path, advantage_estimator="grpo", empty_tool="exclude").estimator_options == {}
    with pytest.raises(ValueError, match=r"^SLCAGRPOConfig.empty_tool='nope': estimator 'slca': option 'empty_tool' must be one of"):
        base_args(tmp_path, advantage_estimator="grpo", empty_tool="nope")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the defaults, and the new spelling, warn of nothing of slca's
        warnings.filterwarnings("ignore", message=r"`\w*gradient_checkpointing\w*` is deprecated")  # transformers' own
        base_args(tmp_path, empty_tool="both", empty_summary="last_turn", estimator_options={"empty_tool": "exclude"})
    from trl import TrlParser

    with pytest.warns(FutureWarning, match="SLCAGRPOConfig.empty_tool is deprecated"):  # the old command-line flag
        (args,) = TrlParser((SLCAGRPOConfig,)).parse_args_and_config(
            args=["--output_dir", str(tmp_path), "--empty_tool", "include", "--use_cpu", "--bf16", "false"])
    assert args.estimator_options == {"empty_tool": "include"}


def test_estimator_inputs_function_reaches_the_estimator(tmp_path):
    """``estimator_inputs``: an input computed by a function called as a reward function (no tasks needed)."""
    tok = build_tokenizer()
    rollout_func, parts, shapes = scripted_rollout_func(tok)
    seen = {}

    def turn_rewards(prompts, completions, completion_ids, **columns):
        seen["columns"] = sorted(columns)
        # row i: turns of shape i % 4 (call, env, answer ...); one score per call turn
        return torch.tensor([[1.0, float("nan")], [0.0, float("nan")], [float("nan")] * 2, [1.0, 0.0],
                             [0.0, float("nan")], [1.0, float("nan")], [float("nan")] * 2, [0.0, 1.0]])

    funcs = [lambda completions, **_: [1.0] * len(completions), lambda completions, **_: [0.0] * len(completions)]
    for f, n in zip(funcs, ["t", "s"]):
        f.__name__ = n
    t = SLCAGRPOTrainer(model=build_policy(tok), processing_class=tok, reward_funcs=funcs,
                        args=base_args(tmp_path, advantage_estimator="slca_turn", shuffle_dataset=False),
                        train_dataset=dataset(8), rollout_func=rollout_func, estimator_inputs={"turn_rewards": turn_rewards})
    out = t._generate_and_score_completions([dict(x) for x in t.train_dataset])
    assert "prompt" not in seen["columns"]
    adv = out["advantages"]
    # constant tier rewards: only the turn term is left. Group 0 (rows 0-3): turn 0 scores 1, 0, -, 1 -> +-0.577;
    # row 3's second call (turn 1) is in its tool segment but alone in its cell -> 0. Group 1 (rows 4-7): turn 0
    # scores 0, 1, -, 0; turn 1 only row 7 (1.0, whose second call is its last tool turn, also alone).

    def norm(v):
        v = np.array(v)
        return (v - v.mean()) / (v.std(ddof=1) + EPS)
    g0, g1 = norm([1.0, 0.0, 1.0]), norm([0.0, 1.0, 0.0])
    call = len(parts["call"])
    for row, want in [(0, g0[0]), (1, g0[1]), (3, g0[2]), (4, g1[0]), (5, g1[1]), (7, g1[2])]:
        torch.testing.assert_close(adv[row, :call], torch.full((call,), float(want)), atol=1e-5, rtol=1e-5)
    assert torch.all(adv[2] == 0) and torch.all(adv[6] == 0)  # no call, constant rewards
