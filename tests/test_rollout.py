"""Batched multi-turn rollouts: logprob consistency, exact masks, stop reasons, parse-error turns, determinism.

Two real tiny Qwen2 models (transformers, built from a Qwen2Config): a random one,
and one trained here for a few seconds to reproduce scripted tool-use
conversations (a call, a parallel call, a malformed call, an endless chain), so
that greedy rollouts take known paths through the engine.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch

pytest.importorskip("trl")  # the Qwen2.5 / Llama 3.1 chat templates come from TRL's chat_templates/

from _tok import DEFAULT_CORPUS, make_qwen_tokenizer, memorise, spans, tiny_qwen2  # noqa: E402

from slca import segment_masks  # noqa: E402
from slca.chat import encode_conversation, get_format, template_messages  # noqa: E402
from slca.generation.rollout import RolloutConfig, answer_turn, assistant_message, generate_rollouts, sample_tokens, trajectory_logprobs  # noqa: E402
from slca.types import Task, ToolResult  # noqa: E402

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
    },
}
TOOLS = [ADD]
EOT = "<|im_end|>"


class AddEnv:
    """A Python-callable simulator: ``add`` and nothing else; records every call."""

    def __init__(self):
        self.calls = []

    def call(self, name, arguments, episode=0):
        self.calls.append((name, dict(arguments), episode))
        if name != "add":
            return ToolResult(ok=False, error=f"unknown tool {name!r}")
        if set(arguments) != {"a", "b"} or not all(isinstance(v, int) for v in arguments.values()):
            return ToolResult(ok=False, error="add takes two integers a and b")
        return ToolResult(ok=True, content={"sum": arguments["a"] + arguments["b"]})


def call_text(*pairs):
    return "\n".join(f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>' for a, b in pairs)


BROKEN = '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 4}\n</tool_call>'


def script(user, turns):
    """A conversation where each assistant turn's text is given; tool messages are
    what the rollout engine will answer (the same AddEnv and parse-error messages)."""
    fmt, env = get_format("hermes"), AddEnv()
    msgs = [{"role": "user", "content": user}]
    for text in turns:
        parsed = fmt.parse(text)
        msgs.append(assistant_message(text, parsed))
        if parsed.is_tool_turn:
            msgs += answer_turn(parsed, env, 0)[1]
    return msgs


SCRIPTS = {
    "single": script("Add 1 and 2.", [call_text((1, 2)), "The sum is 3."]),
    "parallel": script("Add 1 and 2, and 5 and 6.", [call_text((1, 2), (5, 6)), "The sums are 3 and 11."]),
    "broken": script("Add 4 and 4.", [BROKEN, "Sorry, I could not do it."]),
    "loop": script("Keep adding 7 and 7.", [call_text((7, 7))] * 4 + ["Done."]),
}


def make_task(name):
    return Task(id=name, messages=SCRIPTS[name][:1], tools=TOOLS)


@pytest.fixture(scope="module")
def tok():
    base = make_qwen_tokenizer()
    corpus = list(DEFAULT_CORPUS) + [base.apply_chat_template(template_messages(m), tools=TOOLS, tokenize=False) for m in SCRIPTS.values()]
    return make_qwen_tokenizer(corpus=corpus, vocab_size=1500)


@pytest.fixture(scope="module")
def scripted(tok, tmp_path_factory):
    """A tiny Qwen2 trained to reproduce SCRIPTS (policy tokens only); greedy decoding follows them.

    The training (~15 s, deterministic) runs once per ``make test``: under pytest-xdist the first module to need it
    (this one or test_fastpath_decode.py, on either worker) stores the weights in the session's shared temporary
    folder, keyed by the tokenizer's vocabulary, and the other loads them (the same tensors, bit for bit)."""
    def train():
        return memorise(tiny_qwen2(len(tok), seed=1), tok, [(m, TOOLS) for m in SCRIPTS.values()])

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return train()
    from filelock import FileLock

    key = hashlib.sha256(json.dumps(sorted(tok.get_vocab().items())).encode()).hexdigest()[:16]
    path = tmp_path_factory.getbasetemp().parent / f"scripted-qwen2-{key}.pt"
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            model = tiny_qwen2(len(tok), seed=1)
            model.load_state_dict(torch.load(path, weights_only=True))
            return model.eval()
        model = train()
        torch.save(model.state_dict(), path)
        return model


def greedy(**kw):
    return RolloutConfig(**{"group_size": 1, "max_turns": 6, "max_new_tokens": 80, "max_total_tokens": 1024, "temperature": 0.0, **kw})




def test_scripted_rollouts_follow_the_scripts_with_exact_masks(tok, scripted):
    names = ["single", "parallel", "broken"]
    res = generate_rollouts(scripted, tok, [make_task(n) for n in names], lambda t: AddEnv(), greedy())
    assert [t.group_id for t in res.trajectories] == [0, 1, 2]
    for name, tr in zip(names, res.trajectories):
        expected = SCRIPTS[name]
        assert tr.stop_reason == "final_answer", (name, [t.text for t in tr.turns])
        assert tr.messages == expected
        # the policy mask decoded is exactly the assistant turns, each with its end-of-turn token
        assert spans(tok, tr.response_ids, tr.model_mask) == [t.text + EOT for t in tr.turns]
        # ... and the whole trajectory is exactly what encode_conversation makes of its messages
        enc = encode_conversation(tok, tr.messages, TOOLS)
        n = len(tr.prompt_ids) + len(tr.response_ids)
        assert tr.prompt_ids + tr.response_ids == enc.input_ids[:n]
        assert [0] * len(tr.prompt_ids) + tr.model_mask == enc.model_mask[:n]
        assert tok.decode(enc.input_ids[n:]) == "\n"  # the template's newline after the last end-of-turn
        assert len(tr.prompt_ids) == enc.prompt_length
        # environment tokens carry logprob 0; segments: tool turns, then the final answer
        assert all(lp == 0.0 for lp, m in zip(tr.logprobs, tr.model_mask) if not m)
        tool_m, summ_m = segment_masks(torch.tensor([tr.model_mask]))
        assert spans(tok, tr.response_ids, tool_m[0].tolist()) == [t.text + EOT for t in tr.turns[:-1]]
        assert spans(tok, tr.response_ids, summ_m[0].tolist()) == [tr.turns[-1].text + EOT]
        assert tr.final_text == tr.turns[-1].parsed.content
    single, parallel, broken = res.trajectories
    assert single.final_text == "The sum is 3." and [r.content for r in single.turns[0].results] == [{"sum": 3}]
    assert [c.arguments for c in parallel.turns[0].parsed.calls] == [{"a": 1, "b": 2}, {"a": 5, "b": 6}]
    assert [r.content for r in parallel.turns[0].results] == [{"sum": 3}, {"sum": 11}]


def test_parse_error_turn_gets_an_error_tool_message(tok, scripted):
    env = AddEnv()
    res = generate_rollouts(scripted, tok, [make_task("broken")], lambda t: env, greedy())
    tr = res.trajectories[0]
    first = tr.turns[0]
    assert first.text == BROKEN
    assert [e.kind for e in first.parsed.errors] == ["invalid_json"] and first.parsed.calls == []
    assert len(first.results) == 1 and not first.results[0].ok and "invalid_json" in first.results[0].error
    assert tr.messages[2]["role"] == "tool" and "could not parse your tool call" in tr.messages[2]["content"]
    assert env.calls == []  # nothing reached the simulator
    assert tr.stop_reason == "final_answer"


def test_rollout_hits_max_turns(tok, scripted):
    env = AddEnv()
    res = generate_rollouts(scripted, tok, [make_task("loop")], lambda t: env, greedy(max_turns=2))
    tr = res.trajectories[0]
    assert tr.stop_reason == "max_turns" and len(tr.turns) == 2
    assert all(t.parsed.is_tool_turn and t.results for t in tr.turns)
    assert [c[:2] for c in env.calls] == [("add", {"a": 7, "b": 7})] * 2
    # the last turn's calls were answered: the trajectory ends on environment tokens, so no summary
    assert tr.model_mask[-1] == 0 and tr.messages[-1]["role"] == "tool"
    # (trailing environment tokens are real tokens, not padding: pass valid_mask)
    mm = torch.tensor([tr.model_mask])
    tool_m, summ_m = segment_masks(mm, torch.ones_like(mm))
    assert summ_m.sum() == 0 and tool_m.sum() == sum(tr.model_mask)


def test_max_tokens_per_turn_and_total(tok, scripted):
    res = generate_rollouts(scripted, tok, [make_task("single")], lambda t: AddEnv(), greedy(max_new_tokens=5))
    tr = res.trajectories[0]
    assert tr.stop_reason == "max_tokens" and len(tr.response_ids) == 5 and sum(tr.model_mask) == 5
    prompt_len = len(tr.prompt_ids)
    res = generate_rollouts(scripted, tok, [make_task("loop")], lambda t: AddEnv(), greedy(max_total_tokens=prompt_len + 60))
    tr = res.trajectories[0]
    assert tr.stop_reason == "max_tokens"
    assert len(tr.prompt_ids) + sum(1 for m in tr.model_mask if m) <= prompt_len + 60


def test_sampled_logprobs_match_one_forward_rescoring(tok, scripted):
    """Multi-turn sampled rollouts (cache with holes between rows) re-scored in one forward pass."""
    tasks = [make_task(n) for n in ("single", "parallel", "broken", "loop")]
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        cfg = RolloutConfig(group_size=3, max_turns=3, max_new_tokens=40, max_total_tokens=600, temperature=temperature, top_p=top_p, seed=3)
        res = generate_rollouts(scripted, tok, tasks, lambda t: AddEnv(), cfg)
        assert sum(len(t.turns) > 1 for t in res.trajectories) >= 4  # several multi-turn rows
        assert len({len(t.response_ids) for t in res.trajectories}) > 1  # rows of different lengths
        rescored = trajectory_logprobs(scripted, res.trajectories, temperature)
        for tr, lp in zip(res.trajectories, rescored):
            m = torch.tensor(tr.model_mask, dtype=torch.bool)
            got = torch.tensor(tr.logprobs)
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got[m], lp[m], atol=1e-4, rtol=1e-4)
        assert res.gen_tokens == sum(sum(t.model_mask) for t in res.trajectories)


def test_random_model_logprobs_and_determinism(tok):
    model = tiny_qwen2(len(tok), seed=5)
    tasks = [make_task(n) for n in ("single", "loop")]
    cfg = RolloutConfig(group_size=4, max_turns=2, max_new_tokens=24, max_total_tokens=400, temperature=1.0, seed=11)
    a = generate_rollouts(model, tok, tasks, lambda t: AddEnv(), cfg).trajectories
    b = generate_rollouts(model, tok, tasks, lambda t: AddEnv(), cfg).trajectories
    c = generate_rollouts(model, tok, tasks, lambda t: AddEnv(), RolloutConfig(**{**cfg.__dict__, "seed": 12})).trajectories
    assert [t.response_ids for t in a] == [t.response_ids for t in b]
    assert [t.logprobs for t in a] == [t.logprobs for t in b]
    assert [t.stop_reason for t in a] == [t.stop_reason for t in b]
    assert [t.response_ids for t in a] != [t.response_ids for t in c]
    # group members differ (sampling), and the group shares its prompt
    assert len({tuple(t.response_ids) for t in a[:4]}) > 1 and len({tuple(t.prompt_ids) for t in a[:4]}) == 1
    for tr, lp in zip(a, trajectory_logprobs(model, a, 1.0)):
        m = torch.tensor(tr.model_mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(tr.logprobs)[m], lp[m], atol=1e-4, rtol=1e-4)


def test_episode_per_group_member(tok, scripted):
    env = AddEnv()
    generate_rollouts(scripted, tok, [make_task("single")], lambda t: env, greedy(group_size=3))
    assert sorted(c[2] for c in env.calls) == [0, 1, 2]


def test_sample_tokens_top_p_and_greedy():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    seen = {int(sample_tokens(logits, 1.0, 0.6, gen)[0]) for _ in range(200)}
    assert seen == {0, 1}  # 0.5 < 0.6 needs the second token; the third is cut
    tok_, lp = sample_tokens(logits, 0.0, 1.0, None)
    assert int(tok_) == 0 and torch.allclose(lp, torch.log(torch.tensor([0.5])))
    tok_, lp = sample_tokens(logits, 2.0, 1.0, gen)
    assert torch.allclose(lp, torch.log_softmax(logits / 2.0, -1)[0, tok_])


def test_config_validation():
    with pytest.raises(ValueError, match="group_size"):
        RolloutConfig(group_size=0)
    with pytest.raises(ValueError, match="top_p"):
        RolloutConfig(top_p=0.0)
    with pytest.raises(ValueError, match="unknown tool-call format"):
        RolloutConfig(format="xml")


def test_rollouts_and_eval_share_one_sampling_declaration():
    """RolloutConfig and slca eval's GenerationConfig are both a Sampling: the same fields, the same checks
    (each bad value refused by both, naming the class and the field), keyword arguments only; an agent's
    settings reach its in-domain rollouts unchanged (RolloutConfig.of)."""
    import dataclasses

    from slca.eval.agent import GenerationConfig
    from slca.generation.rollout import Sampling

    names = [f.name for f in dataclasses.fields(Sampling)]
    assert names == ["max_new_tokens", "temperature", "top_p", "seed"]
    for cls in (RolloutConfig, GenerationConfig):
        assert issubclass(cls, Sampling) and [f.name for f in dataclasses.fields(cls)][:4] == names
        for bad in ({"max_new_tokens": 0}, {"temperature": -0.5}, {"temperature": float("nan")}, {"top_p": 0.0}, {"top_p": 1.5}, {"seed": 1.5}):
            (name,) = bad
            with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{name} must"):
                cls(**bad)
        with pytest.raises(TypeError):
            cls(8)  # positional: refused rather than read into another field
    assert (GenerationConfig().max_new_tokens, GenerationConfig().temperature) == (256, 0.0)  # slca eval's defaults: greedy, 256 tokens
    gen = GenerationConfig(max_new_tokens=7, temperature=0.7, top_p=0.9, seed=3, batch_size=2)
    cfg = RolloutConfig.of(gen, group_size=2, max_turns=3)
    assert (cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.seed, cfg.group_size, cfg.max_turns) == (7, 0.7, 0.9, 3, 2, 3)


def test_parked_rows_keep_exact_logprobs(tok, scripted, monkeypatch):
    """Rows that end their turn early leave the batch (parked) and rejoin for the next turn; nothing changes for them."""
    from slca.generation.fastpath import FastBatch
    from slca.generation.kvcache import CacheBatch

    parks = []

    def counting(original):
        def park(self, keep):
            parks.append(int((~keep).sum()))
            return original(self, keep)
        return park

    for cls in (CacheBatch, FastBatch):  # the transformers-backed batch and the fast path's
        monkeypatch.setattr(cls, "park", counting(cls.park))
    tasks = [make_task(n) for n in ("single", "broken", "single", "parallel")]
    cfg = RolloutConfig(group_size=4, max_turns=3, max_new_tokens=80, max_total_tokens=700, temperature=1.0, seed=7)
    res = generate_rollouts(scripted, tok, tasks, lambda t: AddEnv(), cfg)
    assert parks, "no rows were parked"
    assert sum(len(t.turns) > 1 for t in res.trajectories) >= 8
    for tr, lp in zip(res.trajectories, trajectory_logprobs(scripted, res.trajectories, 1.0)):
        m = torch.tensor(tr.model_mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(tr.logprobs)[m], lp[m], atol=1e-4, rtol=1e-4)
        assert spans(tok, tr.response_ids, tr.model_mask)[: len(tr.turns)] == [
            t.text + EOT if i < len(tr.turns) - 1 or tr.stop_reason != "max_tokens" else t.text for i, t in enumerate(tr.turns)
        ]


def test_llama3_template_rollout_with_llama3_json_calls():
    """The engine is template-generic: Llama 3.1's template (end of turn <|eot_id|>, tool role 'ipython')."""
    from _tok import make_llama3_tokenizer

    fmt, env = get_format("llama3_json"), AddEnv()
    msgs = [{"role": "user", "content": "Add 2 and 3."}]
    for text in ['{"name": "add", "parameters": {"a": 2, "b": 3}}', "The sum is 5."]:
        parsed = fmt.parse(text)
        msgs.append(assistant_message(text, parsed))
        if parsed.is_tool_turn:
            msgs += answer_turn(parsed, env, 0)[1]
    base = make_llama3_tokenizer()
    tok = make_llama3_tokenizer(corpus=list(DEFAULT_CORPUS) + [base.apply_chat_template(template_messages(msgs), tools=TOOLS, tokenize=False)], vocab_size=1000)
    model = memorise(tiny_qwen2(len(tok), seed=3), tok, [(msgs, TOOLS)])
    task = Task(id="llama", messages=msgs[:1], tools=TOOLS)
    res = generate_rollouts(model, tok, [task], lambda t: AddEnv(), greedy(format="llama3_json"))
    tr = res.trajectories[0]
    assert tr.stop_reason == "final_answer" and tr.messages == msgs
    assert [r.content for r in tr.turns[0].results] == [{"sum": 5}]
    assert spans(tok, tr.response_ids, tr.model_mask) == [t.text + "<|eot_id|>" for t in tr.turns]
    enc = encode_conversation(tok, tr.messages, TOOLS)
    assert enc.input_ids == tr.prompt_ids + tr.response_ids  # Llama writes nothing after the last <|eot_id|>
    assert enc.model_mask == [0] * len(tr.prompt_ids) + tr.model_mask


def test_calls_in_a_cut_off_turn_are_recorded_as_not_executed(tok, scripted):
    from slca.rewards import execution_reward

    full = generate_rollouts(scripted, tok, [make_task("single")], lambda t: AddEnv(), greedy()).trajectories[0]
    n_first = full.model_mask.index(0)  # the first turn: the call and its end-of-turn token
    env = AddEnv()
    tr = generate_rollouts(scripted, tok, [make_task("single")], lambda t: env, greedy(max_new_tokens=n_first - 1)).trajectories[0]
    assert tr.stop_reason == "max_tokens" and env.calls == []  # the call never reached the environment
    turn = tr.turns[0]
    assert turn.parsed.calls and len(turn.results) == len(turn.parsed.calls)
    assert all(not r.ok and "not executed" in r.error for r in turn.results)
    # so the execution reward scores the rollout (no NaN) and gives no execution credit
    r = execution_reward(make_task("single"), tr.turns)
    assert r.total == r.total and r.components.get("success", 0.0) == 0.0
