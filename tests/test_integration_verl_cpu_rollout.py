"""slca.integrations.verl_cpu_rollout: verl's rollout server, replica and adapter over ``transformers.generate``.

The server is built in this process (no Ray); the real trainer driving it: test_integration_verl_cpu.py.
Runs in the verl environment (.venv-verl; the verl line of ``make test``).
"""

from __future__ import annotations

import asyncio
import re

import pytest

pytestmark = pytest.mark.verl
torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from slca.integrations import verl_cpu  # noqa: E402
from slca.integrations.verl_cpu_rollout import LOG_PREFIX, HFReplica, HFRolloutServer, HFServerAdapter, server_name  # noqa: E402

from test_integration_verl_cpu import MODEL, SHRINK, WEIGHT_LINE, _compose  # noqa: E402


def _server(load_format="auto"):
    from omegaconf import OmegaConf, open_dict

    from slca.integrations.verl_cpu_rollout import HFRolloutServer

    cfg = _compose(SHRINK + verl_cpu.cpu_overrides() + [f"actor_rollout_ref.model.path={MODEL}"])
    with open_dict(cfg):
        cfg.actor_rollout_ref.rollout.load_format = load_format
    OmegaConf.resolve(cfg)
    return HFRolloutServer(cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model)


def test_rollout_server_generates_as_verl_asks_and_takes_the_trainers_weights():
    """Token in, token out, with verl's sampling parameters; log-probs are the model's; a weight load replaces
    the model's tensors (by HF name) and the version travels in extra_fields."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    ref = AutoModelForCausalLM.from_pretrained(MODEL, attn_implementation="sdpa").eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the weather in Paris?"}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    server = _server()
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    out = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=dict(greedy, max_tokens=12), request_id="a"))
    assert 1 <= len(out.token_ids) <= 12 and out.stop_reason == "completed"
    assert out.extra_fields == {"global_steps": None}
    with torch.no_grad():
        logits = ref(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    expect = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(out.log_probs), expect, atol=1e-4, rtol=1e-4)
    assert out.token_ids == logits.argmax(-1).tolist()  # greedy
    # a stop token verl adds (the tool parser's) ends generation on it, as vLLM does
    stop = out.token_ids[1]
    cut = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=dict(greedy, stop_token_ids=[stop]), request_id="b"))
    assert cut.token_ids == out.token_ids[: out.token_ids.index(stop) + 1]
    # without max_tokens: what is left of response_length within prompt_length + response_length
    sampled = asyncio.run(server.generate(prompt_ids=prompt, sampling_params={"temperature": 1.0, "top_p": 0.9, "top_k": 50,
                                                                               "ignore_eos": True}, request_id="c"))
    assert len(sampled.token_ids) == 256 and sampled.log_probs is None
    # the trainer's weights: names are HF names; the version comes back with each request
    sd = {n: p.detach() + 0.01 for n, p in ref.named_parameters()}
    info = server.update_weights(list(sd.items()), global_steps=3)
    assert info["tensors"] == len(sd) and abs(info["max_abs_change"] - 0.01) < 1e-5
    assert asyncio.run(server.generate(prompt_ids=prompt, sampling_params=dict(greedy, max_tokens=2),
                                       request_id="d")).extra_fields["global_steps"] == 3
    with pytest.raises(KeyError, match="does not have"):
        server.update_weights([("model.not_a_layer.weight", torch.zeros(1))])


def test_dummy_load_format_starts_from_random_weights():
    """As vLLM with load_format=dummy: the rollout holds no trained weights until the trainer's arrive."""
    from transformers import AutoModelForCausalLM

    ref = dict(AutoModelForCausalLM.from_pretrained(MODEL).named_parameters())
    server = _server("dummy")
    w = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(server.tensors[w], ref[w])
    server.update_weights([(n, p.detach()) for n, p in ref.items()], global_steps=0)
    assert torch.equal(server.tensors[w], ref[w])


# ------------------------------------------------------------------ the server's edges (random weights: no sampled token is read)


@pytest.fixture(scope="module")
def dummy():
    return _server("dummy")


def test_server_name_is_what_the_adapter_looks_up():
    assert server_name(0) == "hf_server_0" and server_name(3, "reward_") == "reward_hf_server_3"
    assert LOG_PREFIX == "[slca-cpu-rollout]"


def test_max_tokens_is_capped_by_the_room_left_in_max_model_len(dummy):
    room = 3
    prompt = [5] * (dummy.max_model_len - room)
    out = asyncio.run(dummy.generate(prompt_ids=prompt, sampling_params={"temperature": 0.0, "max_tokens": 50, "ignore_eos": True},
                                     request_id="a"))
    assert len(out.token_ids) == room
    full = [5] * dummy.max_model_len
    with pytest.raises(ValueError, match=f"prompt of {len(full)} tokens leaves no room within max_model_len={dummy.max_model_len}"):
        asyncio.run(dummy.generate(prompt_ids=full, sampling_params={}, request_id="b"))


def test_the_rollout_is_text_only(dummy):
    with pytest.raises(NotImplementedError, match="text-only"):
        asyncio.run(dummy.generate(prompt_ids=[5, 6], sampling_params={}, request_id="c", image_data=[object()]))


def test_sampled_log_probs_are_one_per_token_and_the_version_follows_set_global_steps(dummy):
    asyncio.run(dummy.set_global_steps(7))
    out = asyncio.run(dummy.generate(prompt_ids=[5, 6, 7], request_id="d", sampling_params={
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 4, "ignore_eos": True, "logprobs": True}))
    assert len(out.token_ids) == len(out.log_probs) == 4 and all(lp <= 0 for lp in out.log_probs)
    assert out.extra_fields == {"global_steps": 7}


def test_update_weights_refuses_a_shape_it_does_not_have_and_prints_the_load_line(dummy, capsys):
    name, w = next(iter(dummy.tensors.items()))
    with pytest.raises(ValueError, match=re.escape(f"{name}: the trainer sent shape (1,), the rollout model has {tuple(w.shape)}")):
        dummy.update_weights([(name, torch.zeros(1))])
    before = dummy.global_steps
    info = dummy.update_weights([(name, w.detach().clone())])  # the same values: no change, no new version
    assert info == {"tensors": 1, "max_abs_change": 0.0} and dummy.global_steps == before
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(LOG_PREFIX)]
    assert WEIGHT_LINE.fullmatch(line).groups() == ("0", "1", "None", "0.000e+00")  # the line the end-to-end test reads


def test_control_calls_keep_verls_bookkeeping(dummy):
    assert dummy.ready() is True and dummy.get_server_address()[1] == 0
    assert asyncio.run(dummy.abort_all_requests()) == {"aborted_count": 0, "request_ids": []}
    assert asyncio.run(dummy.abort_request("r1")) == {"aborted": False, "request_id": "r1"}
    for call in (dummy.wake_up, dummy.sleep, dummy.clear_kv_cache, dummy.release_kv_cache, dummy.resume_kv_cache,
                 dummy.wait_for_requests_to_drain, dummy.resume_generation, dummy.resume_engine_generation,
                 dummy.open_submission_gate, dummy.start_profile, dummy.stop_profile):
        assert asyncio.run(call()) is None, call.__name__


# ------------------------------------------------------------------ replica and adapter


def _rollout_cfg(*overrides):
    from omegaconf import OmegaConf

    cfg = _compose(SHRINK + verl_cpu.cpu_overrides() + [f"actor_rollout_ref.model.path={MODEL}", *overrides])
    OmegaConf.resolve(cfg)
    return cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model


def test_replica_runs_one_process_and_names_its_server_by_role():
    rollout, model = _rollout_cfg()
    assert HFReplica(0, rollout, model)._prefix() == ""
    assert HFReplica(1, rollout, model, is_reward_model=True)._prefix() == "reward_"
    assert HFReplica(2, rollout, model, is_teacher_model=True)._prefix() == "teacher_"
    rollout, model = _rollout_cfg("actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    with pytest.raises(ValueError, match=r"one process per replica.*their product is 2"):
        HFReplica(0, rollout, model, gpus_per_node=2)


@pytest.mark.parametrize("kw,needle", [(dict(wire_format="bucketed"), "takes full tensors"),
                                       (dict(peft_config={"r": 8}), "takes merged weights")])
def test_adapter_refuses_what_the_server_cannot_load(kw, needle):
    with pytest.raises(NotImplementedError, match=needle):  # refused before any weight is read or the server is looked up
        asyncio.run(HFServerAdapter.update_weights(object(), iter([]), **kw))
