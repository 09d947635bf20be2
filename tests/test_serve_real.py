"""``transformers serve`` on loopback as the real backend of slca's LLM-backed parts (issue 30).

One real server (transformers' own FastAPI server, in a subprocess) serves model folders written by
``slca export-model``: SmolLM2-135M-Instruct (the ``smollm2`` extra) and the embedded model. Against it,
end to end: the LLM tool simulator (:class:`slca.env.LLMSimulator`) answering a toolworld call, the summary
tier's LLM judge (:class:`slca.rewards.OpenAIJudge` inside ``summary_reward``), and tau2's user simulator
through ``slca eval --suite tau2 --user-url``. Nothing here pins what a model says (it differs between CPUs):
each test pins that the request went through and that whatever came back took the documented path.

A malformed tool call: a folder of the embedded model whose generation config biases ``<tool_call>`` by +100
writes ``<tool_call><tool_call>...`` on every CPU. Served with the response template that parses tool calls,
the server refuses the request (its parser raises a ValueError: HTTP 500 up to transformers 5.24, HTTP 400 from
5.25, which answers a ValueError as the request's fault); slca's three clients turn that into their documented results
(a failed ToolResult, an unscorable judge, a user-failure record), never an exception out of a rollout or an
evaluation. Exported as ``slca export-model`` writes it (text response template), the same model's reply is an
ordinary 200 whose text the simulator refuses as not JSON and asks again.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

import httpx  # noqa: E402

from slca.env import toolworld as tw  # noqa: E402
from slca.env.llm import LLMSimulator  # noqa: E402
from slca.models.serving import TransformersServer, export_for_serving  # noqa: E402
from slca.rewards import OpenAIJudge, digit_logit_bias, summary_reward  # noqa: E402
from slca.rewards.execution import Unscorable  # noqa: E402
from slca.types import ParsedTurn, Turn  # noqa: E402

TASK = next(t for t in tw.make_tasks("train", n=100) if t.meta["task_type"] == "weather")
LONG = 900.0  # a request's deadline: a 135M model on one busy CPU core answers in tens of seconds
MODELS = ["tiny", "smollm2"]


def _require_smollm2() -> None:
    """Skip (as a missing extra: CI's SLCA_REQUIRE_EXTRAS=1 makes it a failure) when the smollm2 extra is absent."""
    from slca.models.smollm2 import INSTALL_HINT, smollm2_problem

    problem = smollm2_problem()
    if problem is not None:
        pytest.skip(f"could not import the smollm2 extra ({problem}); {INSTALL_HINT}")


def _biased(folder, token: str = "<tool_call>", bias: float = 100.0) -> None:
    """Make the model in ``folder`` write ``token`` at every step (its generation config's ``sequence_bias``)."""
    from transformers import AutoTokenizer, GenerationConfig

    tid = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(token)
    g = GenerationConfig.from_pretrained(folder)
    g.sequence_bias = [[[tid], bias]]
    g.max_new_tokens = 8
    g.save_pretrained(folder)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server and the folders it serves: ``tiny`` (the embedded model, text template), ``smollm2`` (when the
    extra is installed), ``malformed-calls`` / ``malformed-text`` (the embedded model writing ``<tool_call>``
    forever, with the tool-call parsing template / the text template)."""
    root = tmp_path_factory.mktemp("serve")
    folders = {"tiny": export_for_serving("default", root / "tiny")}
    folders["malformed-calls"] = export_for_serving("default", root / "malformed-calls", tool_calls=True)
    folders["malformed-text"] = root / "malformed-text"
    shutil.copytree(folders["tiny"], folders["malformed-text"])
    for name in ("malformed-calls", "malformed-text"):
        _biased(folders[name])
    from slca.models.smollm2 import smollm2_problem

    if smollm2_problem() is None:
        folders["smollm2"] = export_for_serving("smollm2", root / "smollm2")
    server = TransformersServer(root / "server.log").start()
    server.folders = {k: str(v) for k, v in folders.items()}
    yield server
    server.stop()
    shutil.rmtree(root / "smollm2", ignore_errors=True)  # 540 MB of weights; pytest keeps its last three temporary folders


def _folder(served, name: str) -> str:
    if name == "smollm2":
        _require_smollm2()
    return served.folders[name]


def _post(served, model: str, **body) -> httpx.Response:
    return httpx.post(f"{served.base_url}/chat/completions", json={"model": model, **body}, timeout=LONG)


@pytest.mark.parametrize("name", MODELS)
def test_llm_simulator_answers_a_toolworld_call_through_the_real_server(served, name):
    model = _folder(served, name)
    sim = LLMSimulator(TASK.tools, base_url=served.base_url, model=model, max_retries=1, max_tokens=48, timeout=LONG, http_attempts=1)
    calls = list(TASK.gold[0])
    r = sim.call(calls[0].name, calls[0].arguments)
    m = sim.metrics
    # the server answered every request (no HTTP fault); what the model said took one of the documented paths
    assert m["requests"] >= 1 and m["http_errors"] == m["timeouts"] == m["connection_errors"] == m["bad_responses"] == 0, dict(m)
    if r.ok:
        assert sim.toolbox.response_error(calls[0].name, r.content) is None
    else:
        assert r.error.startswith("tool simulator failed") and ("not JSON" in r.error or "violates" in r.error), r.error
        assert m["invalid_json"] + m["schema_violations"] == 2 and m["failed"] == 1


@pytest.mark.parametrize("name", MODELS)
def test_llm_judge_scores_a_summary_through_the_real_server(served, name):
    model = _folder(served, name)
    judge = OpenAIJudge(served.base_url, model, max_retries=1, max_tokens=16, timeout=LONG, http_attempts=1)
    env = tw.make_env(TASK)
    calls = TASK.gold[0]
    ref = TASK.reference_answer
    turns = [Turn("<c>", ParsedTurn(calls=list(calls)), [env.call(c.name, c.arguments) for c in calls]), Turn(ref, ParsedTurn(content=ref))]
    s = summary_reward(TASK, turns, ref, judge=judge, judge_weight=0.5)
    m = judge.metrics
    assert m["requests"] >= 1 and m["http_errors"] == m["timeouts"] == m["bad_responses"] == 0, dict(m)
    if math.isnan(s.total):  # the model wrote no score in range twice: NaN with the reason, never a silent 0
        assert "judge failed" in s.reason and ("not a score" in s.reason or "outside 0-10" in s.reason), s.reason
    else:
        assert 0.0 <= s.components["judge"] <= 1.0 and 0.0 <= s.total <= 1.0


@pytest.mark.parametrize("name", MODELS)
def test_llm_judge_constrained_to_digits_through_the_real_server(served, name):
    """transformers serve applies logit_bias (as sequence_bias): +100 on the digits and the end token leaves the model
    nothing else to write, on any CPU; the judge sends the same bias and takes a documented path."""
    from transformers import AutoTokenizer

    model = _folder(served, name)
    bias = digit_logit_bias(AutoTokenizer.from_pretrained(model))
    messages = [{"role": "user", "content": "Rate this answer from 0 to 10: It is 21 C in Oslo."}]
    r = _post(served, model, messages=messages, max_tokens=2, temperature=0.0, logit_bias={str(k): v for k, v in bias.items()})
    assert r.status_code == 200, r.text[:300]
    reply = r.json()["choices"][0]["message"]["content"]
    assert len(reply) <= 2 and all(c in "0123456789" for c in reply), reply
    judge = OpenAIJudge(served.base_url, model, max_retries=0, max_tokens=2, logit_bias=bias, timeout=LONG, http_attempts=1)
    try:
        assert 0.0 <= judge.score(TASK, [], "It is 21 C in Oslo.") <= 1.0
    except Unscorable as e:  # "77" (out of range), "07" (not JSON) or an empty reply: counted, never a score
        assert "outside 0-10" in str(e) or "not a score" in str(e), str(e)
    assert judge.metrics["requests"] == 1 and judge.metrics["http_errors"] == judge.metrics["bad_responses"] == 0, dict(judge.metrics)


def test_tau2_user_simulator_through_slca_eval_user_url(served, tmp_path):
    """The documented command: slca eval --suite tau2 --user-url <server> --user-model <folder> (the embedded
    model as the policy, SmolLM2 as tau2's user simulator)."""
    pytest.importorskip("tau2")
    pytest.importorskip("litellm")
    from typer.testing import CliRunner

    from slca.cli import app

    user = _folder(served, "smollm2")
    out = tmp_path / "eval"
    r = CliRunner().invoke(app, ["eval", "--model", "default", "--suite", "tau2", "--categories", "airline", "--limit", "1",
                                 "--max-steps", "4", "--max-new-tokens", "8", "--user-url", served.base_url, "--user-model", user,
                                 "--user-max-tokens", "24", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "tau2.json").read_text())
    rec = rep["records"][0]
    assert rep["metrics"]["user_failures"] == 0 and rec["detail"]["termination"] != "user_simulator_failed", rec
    assert rec["detail"]["messages"] >= 2 and 0.0 <= rec["scores"]["reward"] <= 1.0  # the greeting and the user's first turn at least


def _malformed_status(served) -> int:
    """The status the server answers the malformed-calls model with: an error, 500 or 400 by transformers' version."""
    r = _post(served, served.folders["malformed-calls"], messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=4)
    assert r.status_code in (400, 500), (r.status_code, r.text[:300])  # the response parser raised on '<tool_call><tool_call>...'
    return r.status_code


def test_a_malformed_tool_call_is_an_http_error_from_the_server_and_a_documented_result_in_slca(served):
    bad = served.folders["malformed-calls"]
    code = _malformed_status(served)
    # the simulator: a failed ToolResult naming the status, counted
    sim = LLMSimulator(TASK.tools, base_url=served.base_url, model=bad, max_retries=0, max_tokens=4, timeout=LONG, http_attempts=1)
    c = TASK.gold[0][0]
    res = sim.call(c.name, c.arguments)
    assert not res.ok and f"HTTP {code}" in res.error and sim.metrics["http_errors"] == 1, res.error
    # the judge: unscorable with the reason (the summary reward is NaN, not 0)
    judge = OpenAIJudge(served.base_url, bad, max_retries=0, max_tokens=4, timeout=LONG, http_attempts=1)
    with pytest.raises(Unscorable, match=f"HTTP {code}"):
        judge.score(TASK, [], "It is 21 C.")


def test_the_same_model_exported_by_slca_answers_its_malformed_call_as_text(served):
    good = served.folders["malformed-text"]
    r = _post(served, good, messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=4)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("<tool_call>")
    sim = LLMSimulator(TASK.tools, base_url=served.base_url, model=good, max_retries=1, max_tokens=4, timeout=LONG, http_attempts=1)
    c = TASK.gold[0][0]
    res = sim.call(c.name, c.arguments)
    assert not res.ok and "not JSON" in res.error
    assert sim.metrics["http_errors"] == 0 and sim.metrics["invalid_json"] == 2 and sim.metrics["requests"] == 2


def test_tau2_user_on_a_server_that_answers_an_error_is_a_user_failure(served):
    pytest.importorskip("tau2")
    pytest.importorskip("litellm")
    from slca.eval import tau2 as T

    from test_eval_tau2 import _gold_agent

    task = T.load_tasks("airline", limit=1)[0]
    code = _malformed_status(served)
    with pytest.raises(T.UserSimulatorError, match=f"HTTP {code}"):
        T.run_simulation("airline", task, lambda env: _gold_agent(env, task, False),
                         lambda task, env: T.llm_user(task, env, base_url=served.base_url, model=served.folders["malformed-calls"], max_tokens=4),
                         seed=0)
