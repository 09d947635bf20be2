"""slca.chat.maskcheck: segment masks read back against the conversation that produced them, with real tokenizers
(the embedded default's and SmolLM2's); masks from slca's own encoder pass, shifted or re-tokenised ones are caught."""

from __future__ import annotations

import time

import pytest
import torch

from _tok import real_tokenizer
from slca.chat import ChatRenderer, MaskMismatchError, check_segment_masks, encode_conversation, enforce_mask_check
from slca.chat.maskcheck import MISMATCH_KINDS, MaskMismatch, check_row_masks
from slca.core.segments import segment_masks

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _call(city: str, i: int = 0) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}


PROMPT = [{"role": "system", "content": "You answer with tools."}, {"role": "user", "content": "Weather in Paris and Rome?"}]
CONVERSATIONS = {
    "call_then_answer": [{"role": "assistant", "content": "", "tool_calls": [_call("Paris")]},
                         {"role": "tool", "name": "get_weather", "content": '{"temp": 21, "sky": "sunny"}'},
                         {"role": "assistant", "content": "It is sunny and 21 C in Paris."}],
    "parallel": [{"role": "assistant", "content": "", "tool_calls": [_call("Paris"), _call("Rome", 1)]},
                 {"role": "tool", "name": "get_weather", "content": '{"temp": 21}'},
                 {"role": "tool", "name": "get_weather", "content": '{"temp": 25}'},
                 {"role": "assistant", "content": "Paris 21 C, Rome 25 C."}],
    "two_turns": [{"role": "assistant", "content": "", "tool_calls": [_call("Paris")]},
                  {"role": "tool", "name": "get_weather", "content": '{"temp": 21}'},
                  {"role": "assistant", "content": "", "tool_calls": [_call("Rome")]},
                  {"role": "tool", "name": "get_weather", "content": '{"temp": 25}'},
                  {"role": "assistant", "content": "Paris 21 C, Rome 25 C."}],
    "answer_only": [{"role": "assistant", "content": "I cannot look that up."}],
}


@pytest.fixture(scope="module", params=["default", "smollm2"])
def tok(request):
    return real_tokenizer(request.param)


def _row(tok, conv):
    """(response ids, model mask, end-of-turn ids) of PROMPT + conv as slca's encoder tokenises it (token-in / token-out)."""
    enc = encode_conversation(tok, PROMPT + conv, TOOLS)
    p = enc.prompt_length
    n = max(i for i, m in enumerate(enc.model_mask) if m) + 1  # a rollout ends at its last end-of-turn token
    return enc.input_ids[p:n], enc.model_mask[p:n], [ChatRenderer(tok, TOOLS).end_of_turn_id()]


def _check(tok, ids, model, conv, eot):
    tool, summ = segment_masks(torch.tensor([model]))
    return check_segment_masks([ids], tool, summ, [conv], tokenizer=tok, fmt="hermes", end_of_turn=eot)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_masks_from_the_conversation_pass(tok, name):
    ids, model, eot = _row(tok, CONVERSATIONS[name])
    assert _check(tok, ids, model, CONVERSATIONS[name], eot) == []


@pytest.mark.parametrize("shift", [1, -1])
@pytest.mark.parametrize("name", ["call_then_answer", "two_turns"])
def test_a_mask_shifted_by_one_token_is_caught(tok, name, shift):
    conv = CONVERSATIONS[name]
    ids, model, eot = _row(tok, conv)
    shifted = torch.roll(torch.tensor(model), shift).tolist()
    found = _check(tok, ids, shifted, conv, eot)
    assert len(found) == 1 and found[0].kind in MISMATCH_KINDS, found
    # without the end-of-turn ids the decoded segments still disagree with the conversation's turns
    assert _check(tok, ids, shifted, conv, []) or shift == -1


def test_an_environment_token_inside_the_tool_segment_is_caught(tok):
    conv = CONVERSATIONS["call_then_answer"]
    ids, model, eot = _row(tok, conv)
    first_env = model.index(0, model.index(1))
    grown = [*model[:first_env], 1, 1, *model[first_env + 2:]]  # the call's run swallows two environment tokens
    found = _check(tok, ids, grown, conv, eot)
    assert [m.kind for m in found] == ["boundary"] and "inside a policy segment" in found[0].detail, found


def test_a_row_without_its_environment_mask_is_caught(tok):
    """TRL without an env_mask: every completion token is a policy token, so the call and the answer are one run."""
    conv = CONVERSATIONS["call_then_answer"]
    ids, _, eot = _row(tok, conv)
    found = _check(tok, ids, [1] * len(ids), conv, eot)
    assert [m.kind for m in found] == ["turns"]


def _split_tokens(tok, text: str) -> list[int]:
    """``text`` tokenised one character at a time: a sampled sequence may be any tokenisation of its text."""
    return [i for ch in text for i in tok(ch, add_special_tokens=False)["input_ids"]]


def test_retokenising_the_conversation_shifts_the_mask_and_is_caught(tok):
    """The policy samples a non-canonical tokenisation of its call; a host that decodes the conversation and
    re-tokenises it whole (TRL before #5242) keeps the mask it counted on the sampled tokens. The merged tokens
    shorten the sequence, so every boundary after them moves: the check catches it. The sampled tokens
    themselves (token-in / token-out) pass: the check reads text, not a canonical tokenisation."""
    conv = CONVERSATIONS["call_then_answer"]
    ids, model, eot = _row(tok, conv)
    start, end = model.index(1), model.index(0, model.index(1))  # the call turn, its end-of-turn token last
    call_text = tok.decode(ids[start:end - 1])
    sampled = ids[:start] + _split_tokens(tok, call_text) + ids[end - 1:]
    grown = len(sampled) - len(ids)
    assert grown > 0 and tok.decode(sampled) == tok.decode(ids)
    sampled_mask = model[:start] + [1] * (end - start + grown) + model[end:]
    assert _check(tok, sampled, sampled_mask, conv, eot) == []
    retok = tok(tok.decode(sampled), add_special_tokens=False)["input_ids"]
    assert len(retok) < len(sampled)
    kept = (sampled_mask + [1] * len(retok))[: len(retok)]  # truncated to the new length, as TRL #5145 did
    found = _check(tok, retok, kept, conv, eot)
    assert len(found) == 1 and found[0].kind in MISMATCH_KINDS, found


def test_a_call_segment_that_is_not_a_call_and_a_wrong_answer_are_named():
    class Chars:  # a tokenizer of one id per character: decode is exact
        def decode(self, ids, skip_special_tokens=False):
            return "".join("|" if i == 0 else chr(i) for i in ids)

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    answer = "Sunny."
    env = "\nTOOL\n"
    ids = [ord(c) for c in call] + [0] + [ord(c) for c in env] + [ord(c) for c in answer] + [0]
    model = [1] * (len(call) + 1) + [0] * len(env) + [1] * (len(answer) + 1)
    tool, summ = segment_masks(torch.tensor([model]))
    good = [{"role": "assistant", "content": "", "tool_calls": [_call("Paris")]}, {"role": "tool", "content": "x"},
            {"role": "assistant", "content": "Sunny."}]
    tool_l, summ_l = tool[0].tolist(), summ[0].tolist()
    assert check_row_masks(ids, tool_l, summ_l, good, decode=Chars().decode, fmt="hermes", end_of_turn=[0]) is None
    other_call = [{**good[0], "tool_calls": [_call("Rome")]}, *good[1:]]
    kind, detail = check_row_masks(ids, tool_l, summ_l, other_call, decode=Chars().decode, fmt="hermes", end_of_turn=[0])
    assert kind == "call" and "turn 0" in detail
    other_answer = [*good[:2], {"role": "assistant", "content": "Rainy."}]
    kind, detail = check_row_masks(ids, tool_l, summ_l, other_answer, decode=Chars().decode, fmt="hermes", end_of_turn=[0])
    assert kind == "summary" and "Rainy" in detail
    # text routed to the tool segment that parses as no call: never raises, named as a call-segment problem
    text_ids = [ord(c) for c in "hello"] + [0] + ids[len(call) + 1:]
    text_model = [1] * 6 + model[len(call) + 1:]
    t2, s2 = segment_masks(torch.tensor([text_model]))
    kind, detail = check_row_masks(text_ids, t2[0].tolist(), s2[0].tolist(), [{"role": "assistant", "content": "hello"}, *good[1:]],
                                   decode=Chars().decode, fmt="hermes", end_of_turn=[0])
    assert kind == "call" and "no call" in detail


def test_the_threshold_stops_the_run_naming_the_rows():
    found = [MaskMismatch(3, "rollout 3 (task 'weather-1')", "call", "turn 0 ...")]
    assert enforce_mask_check(found, 10, 0.1) == pytest.approx(0.1)  # at the threshold: goes on
    with pytest.raises(MaskMismatchError, match=r"1 of 5 rollouts .*rollout 3 \(task 'weather-1'\): call"):
        enforce_mask_check(found, 5, 0.1)
    assert enforce_mask_check(found, 1, 1.0) == 1.0  # count only
    assert enforce_mask_check([], 4, 0.0) == 0.0


def test_the_check_is_cheap_on_a_batch(tok):
    """64 rollouts of two to three turns: the check adds a small fraction of a training step (tens of ms)."""
    convs = [CONVERSATIONS[n] for n in sorted(CONVERSATIONS)] * 16
    rows = [_row(tok, c) for c in convs]
    T = max(len(r[0]) for r in rows)
    ids = torch.tensor([r[0] + [0] * (T - len(r[0])) for r in rows])
    model = torch.tensor([r[1] + [0] * (T - len(r[1])) for r in rows])
    valid = torch.tensor([[1] * len(r[0]) + [0] * (T - len(r[0])) for r in rows])
    tool, summ = segment_masks(model, valid)
    t0 = time.perf_counter()
    found = check_segment_masks(ids, tool, summ, convs, tokenizer=tok, fmt="hermes", end_of_turn=rows[0][2],
                                lengths=valid.sum(dim=1).tolist())
    seconds = time.perf_counter() - t0
    print(f"mask check: {len(rows)} rollouts, {int(valid.sum())} tokens, {seconds * 1e3:.1f} ms")
    assert found == []
    assert seconds < 2.0, seconds  # generous for a busy machine; measured about 10 ms


@pytest.mark.slow
def test_the_trainer_checks_each_step_and_stops_naming_the_rollout(tmp_path, monkeypatch):
    """slca's trainer logs rollout/mask_mismatch (0 on its own rollouts) and, given masks that route a plain answer
    to the execution segment, stops before the update with the rollout and its task named."""
    from dataclasses import replace

    from recipes.warmstart.build import make_model
    from recipes.warmstart.config import ModelSize

    from slca import metrics as M
    from slca.env import toolworld
    from slca.training.config import TrainConfig, validate
    from slca.training.trainer import Trainer

    tok = real_tokenizer("default")
    size = ModelSize(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                     max_position_embeddings=1024)
    cfg = validate(TrainConfig(run_dir=str(tmp_path / "run"), steps=1, tasks_per_step=2, group_size=2, max_turns=2,
                               max_new_tokens=8, max_total_tokens=1024, minibatches=1, eval_every=0, save_every=0,
                               sample_html_every=0, diag_every=0))
    tr = Trainer(cfg, model=make_model(size, tok, seed=0), tokenizer=tok, train_tasks=toolworld.make_tasks("train", n=4, seed=0),
                 make_env=lambda task: toolworld.make_env(task, seed=0))
    m = tr.train_step()
    assert m[M.ROLLOUT_MASK_MISMATCH.name] == 0.0
    credit = Trainer.credit

    def all_tool(self, ro, scored):  # every policy token in the execution segment: plain answers are not calls
        c = credit(self, ro, scored)
        return replace(c, tool_mask=c.tool_mask + c.summary_mask, summary_mask=torch.zeros_like(c.summary_mask))

    monkeypatch.setattr(Trainer, "credit", all_tool)
    before = [p.detach().clone() for p in tr.params]
    with pytest.raises(MaskMismatchError, match=r"rollout 0 \(task '[^']+'\): call: turn 0 is in the execution segment"):
        tr.train_step()
    assert all(torch.equal(a, b) for a, b in zip(before, tr.params))  # stopped before the update


@pytest.mark.slow
def test_trl_tool_loop_logs_the_share_and_stops_above_the_threshold(tmp_path, monkeypatch):
    """Under TRL's own tool loop (a real GRPOTrainer step, the bigram policy of test_integration_trl): the share is
    logged, 0 on TRL's masks; masks that put every policy token in the execution segment stop the run, row named."""
    pytest.importorskip("trl")
    from dataclasses import replace

    import test_integration_trl as T

    from slca import metrics as M
    import slca.integrations.trl as slca_trl

    def trainer(path, **kw):
        return slca_trl.SLCAGRPOTrainer(model=T.build_policy(T.build_tokenizer()), processing_class=T.build_tokenizer(),
                                        reward_funcs=[T.execution_reward, T.summary_reward], train_dataset=T.dataset(8),
                                        args=T.base_args(path, reward_tiers=["tool", "summary"], max_tool_calling_iterations=3, **kw),
                                        tools=[T.get_weather])

    tr = trainer(tmp_path / "a")
    tr.train()
    assert tr.state.log_history[0][M.ROLLOUT_MASK_MISMATCH.name] == 0.0
    real = slca_trl.trl_batch_advantages

    def all_tool(*a, **kw):
        adv, used = real(*a, **kw)
        return adv, replace(used, tool_mask=used.tool_mask + used.summary_mask, summary_mask=torch.zeros_like(used.summary_mask))

    monkeypatch.setattr(slca_trl, "trl_batch_advantages", all_tool)
    with pytest.raises(MaskMismatchError, match=r"row \d+ \(group \d+\): call: turn 0 is in the execution segment"):
        trainer(tmp_path / "b").train()
    trainer(tmp_path / "c", mask_check_max_mismatch=1.0).train()  # count only
