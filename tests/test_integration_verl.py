"""SLCA inside verl 0.9.1 on CPU: registry, dispatch, entry point, token layout, reward function (the agent loop:
test_integration_verl_agent_loop.py; the simulated tool: test_integration_verl_tools.py).

Runs in the verl environment (``make test`` runs this file with .venv-verl's
Python; verl pins transformers < 5.11, which the main environment does not use).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.verl
torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

import slca  # noqa: E402
from slca.integrations import verl as sv  # noqa: E402


def random_batch(seed: int, B: int = 12, T: int = 20, G: int = 4):
    """Rows shaped like verl multi-turn responses: call, tool response, answer, padding.

    Every fourth row made no call; one row ends on a tool response (no answer)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.long)
    lengths = torch.zeros(B, dtype=torch.long)
    for i in range(B):
        n = int(torch.randint(6, T + 1, (1,), generator=g))
        mask[i, :n] = 1
        if i % 4 != 3:
            a = int(torch.randint(1, n - 3, (1,), generator=g))
            mask[i, a : a + 2] = 0  # tool-response tokens
            if i == 5:
                mask[i, a:n] = 0  # stopped after the tool response
        lengths[i] = n
    r_tool = torch.rand(B, generator=g).round(decimals=1)
    r_sum = torch.rand(B, generator=g).round(decimals=1)
    uids = np.array([f"uid-{i // G}" for i in range(B)], dtype=object)
    return mask, lengths, r_tool, r_sum, uids


def reference(mask, r_tool, r_sum, uids, **kw):
    tool, summ = slca.segment_masks(mask)
    return slca.slca_advantages(r_tool, r_sum, list(uids), tool, summ, **kw)


def test_pack_unpack_roundtrip():
    mask, lengths, r_tool, r_sum, _ = random_batch(0)
    R = sv.pack_token_rewards(r_tool, r_sum, mask, lengths)
    t, s = sv.unpack_token_rewards(R, mask)
    torch.testing.assert_close(t, r_tool)
    torch.testing.assert_close(s, r_sum)
    # the summary reward sits where verl's reward managers put the score
    assert all(R[i, lengths[i] - 1] == (r_sum[i] + (r_tool[i] if lengths[i] - 1 == sv.tool_reward_positions(mask)[i] else 0))
               for i in range(len(lengths)))


def test_reward_positions_never_collide():
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]])
    lengths = torch.tensor([6, 3, 3, 1])
    assert sv.tool_reward_positions(mask).tolist() == [0, 0, 1, 1]  # a one-token response: the slot after it
    assert sv.summary_reward_positions(mask, lengths).tolist() == [5, 2, 2, 0]  # ... and its summary where verl's score is
    with pytest.raises(ValueError, match="one-token response"):
        sv.pack_token_rewards(torch.ones(1), torch.ones(1), torch.ones(1, 1), torch.tensor([1]))


def test_one_token_responses_on_verls_layout_equal_verl_grpo():
    """The issue's case: a one-token response without a call, one group; with no execution reward, SLCA
    ("include") must give verl's GRPO advantages. Also read from verl's own layout (score at the last token)."""
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    lengths = torch.tensor([1, 2, 3])
    score = torch.tensor([1.3, -0.9, 0.2])
    uids = np.array(["q"] * 3, dtype=object)
    verl_layout = torch.zeros(3, 3)
    verl_layout[torch.arange(3), lengths - 1] = score
    expect, _ = core_algos.compute_grpo_outcome_advantage(verl_layout, mask, uids)
    packed = sv.pack_token_rewards(torch.zeros(3), score, mask, lengths)
    assert torch.equal(packed.sum(1), score)
    for mode in ("include", "exclude"):
        os.environ["SLCA_EMPTY_TOOL"] = mode
        try:
            got, _ = sv.compute_slca_outcome_advantage(packed, mask, index=uids)
        finally:
            del os.environ["SLCA_EMPTY_TOOL"]
        torch.testing.assert_close(got, expect)
    # verl's own layout: responses of two or more tokens read as tool 0, summary = score
    t, s = sv.unpack_token_rewards(verl_layout[1:], mask[1:])
    assert t.tolist() == [0.0, 0.0] and torch.equal(s, score[1:])


def _verl_make_group_index(batch_size, num_groups, rng):
    """verl's tests/trainer/ppo/test_core_algos_on_cpu.py::_make_group_index (each group >= 2 members)."""
    counts = [2] * num_groups
    for _ in range(batch_size - 2 * num_groups):
        counts[rng.randrange(num_groups)] += 1
    index = [g for g, c in enumerate(counts) for _ in range(c)]
    rng.shuffle(index)
    return np.asarray(index, dtype=np.int64)


def _verl_rand_mask(batch_size, seq_len):
    """verl's _rand_mask: random 0/1, a row without a 1 gets its last token."""
    mask = torch.randint(0, 2, (batch_size, seq_len), dtype=torch.int64).float()
    rows = (mask.sum(dim=-1) == 0).nonzero(as_tuple=True)[0]
    mask[rows, -1] = 1.0
    return mask


@pytest.mark.parametrize("batch_size,seq_len,num_groups,seed", [(64, 128, 5, 0), (128, 256, 8, 1)])
def test_pack_unpack_roundtrip_on_verls_test_masks(batch_size, seq_len, num_groups, seed):
    """verl's own random masks: every row's two rewards come back exactly; the estimator equals slca's."""
    import random

    torch.manual_seed(seed)
    index = _verl_make_group_index(batch_size, num_groups, random.Random(seed))
    mask = _verl_rand_mask(batch_size, seq_len).long()
    last_policy = (torch.arange(seq_len) * mask).amax(dim=1)
    lengths = torch.clamp(last_policy + 1 + torch.randint(0, 3, (batch_size,)), max=seq_len)
    room = sv.summary_reward_positions(mask, lengths) < seq_len
    mask, lengths, index = mask[room], lengths[room], index[room.numpy()]
    r_tool, r_sum = torch.randn(len(lengths)), torch.randn(len(lengths))
    R = sv.pack_token_rewards(r_tool, r_sum, mask, lengths)
    t, s = sv.unpack_token_rewards(R, mask)
    torch.testing.assert_close(t, r_tool)
    torch.testing.assert_close(s, r_sum)
    uids = np.array([str(i) for i in index], dtype=object)
    adv, _ = sv.compute_slca_outcome_advantage(R, mask, index=uids)
    torch.testing.assert_close(adv, reference(mask, r_tool, r_sum, uids))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_registry_function_equals_slca_advantages(seed):
    mask, lengths, r_tool, r_sum, uids = random_batch(seed)
    fn = core_algos.get_adv_estimator_fn("slca")
    adv, ret = fn(token_level_rewards=sv.pack_token_rewards(r_tool, r_sum, mask, lengths), response_mask=mask,
                  index=uids, config=AlgoConfig(adv_estimator="slca"))
    torch.testing.assert_close(adv, reference(mask, r_tool, r_sum, uids))
    assert torch.equal(adv, ret)


def test_compute_advantage_dispatch_equals_slca_advantages():
    mask, lengths, r_tool, r_sum, uids = random_batch(3)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": sv.pack_token_rewards(r_tool, r_sum, mask, lengths), "response_mask": mask},
        non_tensors={"uid": uids},
    )
    out = compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca"))
    torch.testing.assert_close(out.batch["advantages"], reference(mask, r_tool, r_sum, uids))
    # Dr. GRPO centring through verl's own flag
    cfg = AlgoConfig(adv_estimator="slca", norm_adv_by_std_in_grpo=False)
    out = compute_advantage(data, adv_estimator="slca", config=cfg)
    torch.testing.assert_close(out.batch["advantages"], reference(mask, r_tool, r_sum, uids, scale="none"))


def test_reward_extra_info_path_equals_token_layout():
    mask, lengths, r_tool, r_sum, uids = random_batch(4)
    adv, _ = sv.compute_slca_outcome_advantage(
        torch.zeros(mask.shape), mask, index=uids,
        non_tensor_batch={"tool_reward": r_tool.numpy(), "summary_reward": r_sum.numpy()},
    )
    torch.testing.assert_close(adv, reference(mask, r_tool, r_sum, uids))


def test_kl_in_reward_is_rejected():
    mask, lengths, r_tool, r_sum, uids = random_batch(0)
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        sv.compute_slca_outcome_advantage(torch.zeros(mask.shape), mask, index=uids,
                                          config=AlgoConfig(adv_estimator="slca", use_kl_in_reward=True))


def test_register_is_idempotent_and_guarded():
    sv.register()
    sv.register()
    assert core_algos.get_adv_estimator_fn("slca") is sv.compute_slca_outcome_advantage
    with pytest.raises(ValueError):
        core_algos.register_adv_est("slca")(lambda **kw: None)


def _fresh(code: str, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_entry_point_registers_in_a_fresh_process():
    code = ("import verl\nfrom verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
            "f = get_adv_estimator_fn('slca')\nprint(f.__module__ + '.' + f.__name__)")
    r = _fresh(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("slca.integrations.verl.compute_slca_outcome_advantage")
    # with verl's plugin discovery off, nothing registers it: the entry point did
    r = _fresh(code, VERL_USE_EXTERNAL_PLUGINS="none")
    assert r.returncode != 0 and "Unknown advantage estimator" in r.stderr


USER_ESTIMATOR_IN_VERL = """
import os, sys
import numpy as np, torch
import verl                                       # loads slca's plugin: warns now about the bad SLCA_ESTIMATOR
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.ray_trainer import compute_advantage
import slca
from slca.integrations import verl as sv

assert "upkg.estimators" not in sys.modules       # nothing registered the user's estimators in this process
mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0], [1, 0, 0, 1, 1, 1], [1, 1, 0, 1, 1, 0]])
rt, rs = torch.tensor([1.0, 0.0, 0.5, 0.25]), torch.tensor([0.0, 1.0, 0.2, 0.9])
uids = np.array(["a", "a", "b", "b"], dtype=object)
data = DataProto.from_dict(tensors={"token_level_rewards": sv.pack_token_rewards(rt, rs, mask, torch.tensor([6, 4, 6, 5])),
                                    "response_mask": mask}, non_tensors={"uid": uids})

def run():
    return compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca")).batch["advantages"]

try:
    run()
    raise SystemExit("an unresolvable SLCA_ESTIMATOR computed advantages")
except ValueError as e:
    print("RAISED", e)
tool, summ = slca.segment_masks(mask)
os.environ["SLCA_ESTIMATOR"] = "upkg.estimators:half_slca"                  # an import path
torch.testing.assert_close(run(), 0.5 * slca.slca_advantages(rt, rs, list(uids), tool, summ))
os.environ["SLCA_ESTIMATOR"] = "u_ep"                                       # an entry point
torch.testing.assert_close(run(), 2 * slca.grpo_advantages(rt + rs, list(uids), mask))
print("OK")
"""


def test_a_user_estimator_reaches_verls_dispatch_by_import_path_and_entry_point(tmp_path):
    """A fresh verl process that never ran the user's registration: SLCA_ESTIMATOR resolves an import path and a
    slca.estimators entry point through verl's own compute_advantage; an unresolvable one is a warning at
    ``import verl`` (before any model) and the same one-line error on the first batch."""
    from pathlib import Path

    from test_estimator_paths import SRC, write_user_package

    site = tmp_path / "site"
    write_user_package(site, "u", {"u_ep": "upkg.estimators:_double_grpo"})
    log = tmp_path / "calls.txt"
    r = _fresh(USER_ESTIMATOR_IN_VERL, SLCA_ESTIMATOR="nowhere_mod:fn", USER_EST_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(SRC), str(site)]))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-3000:]
    why = "SLCA_ESTIMATOR='nowhere_mod:fn': estimator 'nowhere_mod:fn': no module named 'nowhere_mod'"
    assert f"RAISED {why} (install its package" in r.stdout
    assert f"{why} (install its package, or put the folder that holds it on PYTHONPATH) (adv_estimator=slca will raise this on the first batch)" in r.stderr
    assert [ln.split()[0] for ln in Path(log).read_text().splitlines()] == ["u_half_slca", "u_double_grpo"]


def paper_row():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    gold = [[{"name": "get_weather", "arguments": {"city": "Paris"}}]]
    return {
        "data_source": "slca_toolworld",
        "ground_truth": {"gold_tool_calls": json.dumps(gold), "answer_facts": ["sunny"]},
        "extra_info": {"tools": json.dumps(tools), "index": 7,
                       "prompt": [{"role": "user", "content": "Weather in Paris?"}]},
    }


def test_compute_score_on_the_papers_row_format():
    pytest.importorskip("slca.rewards")
    row = paper_row()
    good = ('<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n</tool_call>\nuser\n'
            '<tool_response>\n{"condition": "sunny", "temperature": 21}\n</tool_response>\nassistant\n'
            "It is sunny in Paris, 21 degrees.")
    wrong_call = good.replace("Paris\"}", "Rome\"}")
    no_answer = good.rsplit("assistant\n", 1)[0]
    s_good = sv.compute_score(row["data_source"], good, row["ground_truth"], row["extra_info"])
    s_wrong = sv.compute_score(row["data_source"], wrong_call, row["ground_truth"], row["extra_info"])
    s_silent = sv.compute_score(row["data_source"], no_answer, row["ground_truth"], row["extra_info"])
    for s in (s_good, s_wrong, s_silent):
        assert set(s) >= {"score", "tool_reward", "summary_reward"}
        assert s["score"] == pytest.approx(s["tool_reward"] + s["summary_reward"])
    assert s_good["tool_reward"] > s_wrong["tool_reward"]
    assert s_good["summary_reward"] > s_silent["summary_reward"]
    # the rollout ran out of turns right after its call: scored (not executed), not NaN, not an error
    cut = good.split("\nuser\n")[0]
    s_cut = sv.compute_score(row["data_source"], cut, row["ground_truth"], row["extra_info"])
    assert 0.0 <= s_cut["tool_reward"] < s_good["tool_reward"] and s_cut["summary_reward"] == 0.0
    # verl's Qwen tool parser format (one JSON object per <tool_call>) scores the same
    hermes = good.replace('[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
                          '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    s_h = sv.compute_score(row["data_source"], hermes, row["ground_truth"],
                           {**row["extra_info"], "tool_call_format": "hermes"})
    assert s_h["tool_reward"] == pytest.approx(s_good["tool_reward"])
    assert s_h["summary_reward"] == pytest.approx(s_good["summary_reward"])


def test_empty_tool_mode_from_environment(monkeypatch):
    """SLCA_ESTIMATOR_OPTIONS=empty_tool=...; unset, the estimator's default (both)."""
    mask, lengths, r_tool, r_sum, uids = random_batch(6)
    R = sv.pack_token_rewards(r_tool, r_sum, mask, lengths)
    monkeypatch.delenv("SLCA_EMPTY_TOOL", raising=False)
    monkeypatch.setenv("SLCA_ESTIMATOR_OPTIONS", "empty_tool=exclude")
    adv, _ = sv.compute_slca_outcome_advantage(R, mask, index=uids)
    torch.testing.assert_close(adv, reference(mask, r_tool, r_sum, uids, empty_tool="exclude"))
    monkeypatch.delenv("SLCA_ESTIMATOR_OPTIONS")
    adv, _ = sv.compute_slca_outcome_advantage(R, mask, index=uids)
    torch.testing.assert_close(adv, reference(mask, r_tool, r_sum, uids, empty_tool="both"))
    monkeypatch.setenv("SLCA_ESTIMATOR_OPTIONS", "empty_tool=bogus")
    with pytest.raises(ValueError, match="^SLCA_ESTIMATOR_OPTIONS='empty_tool=bogus': estimator 'slca': option 'empty_tool'"):
        sv.compute_slca_outcome_advantage(R, mask, index=uids)


def test_deprecated_slca_empty_tool_still_works_warns_once_and_refuses_a_conflict(monkeypatch):
    """SLCA_EMPTY_TOOL (before issue 46): a FutureWarning once per process naming SLCA_ESTIMATOR_OPTIONS, the same
    advantages as the new spelling; both spellings with different values, one line; grpo ignores it as before, but
    a bad value is refused whatever the estimator."""
    mask, lengths, r_tool, r_sum, uids = random_batch(6)
    R = sv.pack_token_rewards(r_tool, r_sum, mask, lengths)
    monkeypatch.setattr(sv, "_WARNED", set())
    monkeypatch.delenv("SLCA_ESTIMATOR_OPTIONS", raising=False)
    monkeypatch.setenv("SLCA_EMPTY_TOOL", "exclude")
    with pytest.warns(FutureWarning, match=r"^SLCA_EMPTY_TOOL is deprecated: set SLCA_ESTIMATOR_OPTIONS=empty_tool=exclude "):
        adv, _ = sv.compute_slca_outcome_advantage(R, mask, index=uids)
    torch.testing.assert_close(adv, reference(mask, r_tool, r_sum, uids, empty_tool="exclude"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # once per process: verl calls the estimator every step
        sv.compute_slca_outcome_advantage(R, mask, index=uids)
        monkeypatch.setenv("SLCA_ESTIMATOR_OPTIONS", "empty_tool=exclude")  # the same value both ways
        assert sv.selected_options(slca.get_estimator("slca")).empty_tool == "exclude"
        monkeypatch.setenv("SLCA_ESTIMATOR_OPTIONS", "empty_tool=include")
        with pytest.raises(ValueError) as e:
            sv.selected_options(slca.get_estimator("slca"))
        assert str(e.value) == ("SLCA_EMPTY_TOOL='exclude' and SLCA_ESTIMATOR_OPTIONS empty_tool='include' disagree: "
                                "set empty_tool in SLCA_ESTIMATOR_OPTIONS only (SLCA_EMPTY_TOOL is deprecated)")
        monkeypatch.delenv("SLCA_ESTIMATOR_OPTIONS")
        assert sv.selected_options(slca.get_estimator("grpo")) == slca.get_estimator("grpo").make_options()
        monkeypatch.setenv("SLCA_EMPTY_TOOL", "bogus")
        with pytest.raises(ValueError, match="^SLCA_EMPTY_TOOL='bogus': estimator 'slca': option 'empty_tool' must be one of"):
            sv.selected_options(slca.get_estimator("grpo"))


def test_estimator_options_from_environment_go_through_the_options_object(monkeypatch):
    """SLCA_ESTIMATOR_OPTIONS: parsed and checked by the estimator's options object, as `slca train` does."""
    from slca.core.beyond import SLCACondOptions
    from slca.core.registry import get_estimator

    monkeypatch.setenv("SLCA_ESTIMATOR", "slca_cond")
    monkeypatch.setenv("SLCA_ESTIMATOR_OPTIONS", "cond_std=subgroup")
    spec = sv.selected_estimator()
    assert sv.selected_options(spec, scale="none", eps=1e-3) == SLCACondOptions(scale="none", eps=1e-3, cond_std="subgroup")
    for raw, why in [("cond_std=x", "option 'cond_std' must be one of"), ("turn_lambda=1", "has no option 'turn_lambda'"),
                     ("eps=0.1", "may not set 'eps': it comes from verl's epsilon"), ("cond_std", "must look like option=value")]:
        monkeypatch.setenv("SLCA_ESTIMATOR_OPTIONS", raw)
        with pytest.raises(ValueError, match=f"^SLCA_ESTIMATOR_OPTIONS='{raw}': .*{why}"):
            sv.selected_options(spec)
    monkeypatch.setenv("SLCA_ESTIMATOR_OPTIONS", "turn_lambda=0.5")
    assert sv.selected_options(get_estimator("slca_turn")).turn_lambda == 0.5


def test_documented_verl_command_matches_verls_config_schema():
    """Every override in examples/verl/run_slca.sh exists in verl's own ppo_trainer config."""
    import re
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    import verl

    script = Path(__file__).resolve().parents[1] / "examples" / "verl" / "run_slca.sh"
    overrides = []
    for line in script.read_text().splitlines():
        m = re.match(r"\s+([a-z_][\w.]*=\S.*?)\s*\\?$", line)
        if m:
            overrides.append(re.sub(r'"?\$\{?(\w+)\}?"?', "x", m.group(1).rstrip(" \\")).replace('"', ""))
    assert any(o == "algorithm.adv_estimator=slca" for o in overrides), overrides
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    algo = omega_conf_to_dataclass(cfg.algorithm)
    assert algo.adv_estimator == "slca" and not algo.use_kl_in_reward
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "slca_tool_agent"
    assert cfg.reward.custom_reward_function.name == "compute_score"


def test_verl_loads_the_reward_function_by_package_and_by_path():
    from verl.utils.import_utils import load_extern_object

    assert load_extern_object("pkg://slca.integrations.verl", "compute_score") is sv.compute_score
    by_path = load_extern_object(sv.__file__, "compute_score")  # executes the file again: registration stays put
    assert by_path.__module__ != sv.__name__
    assert core_algos.get_adv_estimator_fn("slca") is sv.compute_slca_outcome_advantage


# ------------------------------------------------- reward parity, the tools driven as verl drives them


def _prepared(tmp_path, n=60):
    """Run examples/verl/prepare_data.py as shipped; its rows, by task id, and the tools from its config."""
    import pyarrow.parquet as pq
    from verl.tools.tool_registry import initialize_tools_from_config

    script = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "verl" / "prepare_data.py"
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--n", str(n)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["extra_info"]["index"]: row for row in pq.read_table(tmp_path / "train.parquet").to_pylist()}
    tools = {t.name: t for t in initialize_tools_from_config(str(tmp_path / "tool_config.yaml"))}
    return rows, tools


class _Loop:
    """The attributes verl's ToolAgentLoop._call_tool reads: it is run unchanged on this object."""

    def __init__(self, tools):
        self.tools = tools
        self.max_tool_response_length = 100_000
        self.tool_response_truncate_side = "middle"


def _agent_data(messages):
    from verl.experimental.agent_loop.tool_agent_loop import AgentData

    return AgentData(messages=list(messages), image_data=None, video_data=None, audio_data=None, mm_processor_kwargs=None,
                     metrics={}, request_id=f"req-{id(messages)}", tools_kwargs={})


def _call(loop, agent_data, name, arguments):
    import asyncio

    from verl.experimental.agent_loop.tool_agent_loop import FunctionCall, ToolAgentLoop

    resp, _, _ = asyncio.run(ToolAgentLoop._call_tool(loop, FunctionCall(name=name, arguments=json.dumps(arguments)), {},
                                                      agent_data))
    return resp.text


def _verl_rollout(task, row, tools, tok, assistant_texts):
    """One rollout as verl's tool agent loop runs it: verl's hermes parser on each generated turn, verl's
    _call_tool lifecycle on each call, the response decoded as verl's reward loop decodes it."""
    import asyncio

    from verl.experimental.agent_loop.tool_parser import ToolParser

    loop, agent = _Loop(tools), _agent_data(task.messages)
    parser = ToolParser.get_tool_parser("hermes", tok)
    msgs = list(task.messages)
    for text in assistant_texts:
        ids = tok.encode(text + tok.eos_token, add_special_tokens=False)
        _, calls = asyncio.run(parser.extract_tool_calls(ids))
        msgs.append({"role": "assistant", "content": text})
        for c in calls:
            msgs.append({"role": "tool", "content": _call(loop, agent, c.name, json.loads(c.arguments))})
    render = lambda m: tok.apply_chat_template(m, tools=task.tools, add_generation_prompt=m[-1]["role"] != "assistant",  # noqa: E731
                                               tokenize=False)
    prompt, full = render(list(task.messages)), render(msgs)
    assert full.startswith(prompt)
    solution = tok.decode(tok.encode(full[len(prompt):], add_special_tokens=False), skip_special_tokens=True)
    return sv.compute_score(row["data_source"], solution, row["reward_model"]["ground_truth"], row["extra_info"])


def _slca_rollout(task, assistant_texts):
    """The same turns through ``slca train``'s path: its parser, its rollout's tool answering
    (``slca.generation.rollout.answer_turn`` on ``toolworld.make_env``) and the trainer's scorer (``score_batch``)."""
    from slca.chat import get_format
    from slca.env import toolworld
    from slca.rewards.batch import score_batch
    from slca.generation.rollout import answer_turn
    from slca.types import Trajectory, Turn

    fmt, env, turns, final = get_format("hermes"), toolworld.make_env(task), [], ""
    for text in assistant_texts:
        parsed = fmt.parse(text)
        results = answer_turn(parsed, env, 0)[0] if parsed.is_tool_turn else []
        final = "" if parsed.is_tool_turn else parsed.content
        turns.append(Turn(text=text, parsed=parsed, results=results))
    stop = "max_turns" if turns[-1].parsed.is_tool_turn else "final_answer"
    scored = score_batch([Trajectory(task=task, prompt_ids=[], response_ids=[], model_mask=[], logprobs=[], turns=turns,
                                     final_text=final, stop_reason=stop)])
    return float(scored.tool[0]), float(scored.summary[0])


def test_chain_task_scores_the_same_through_verl_and_slca(tmp_path):
    """Chain tasks (state carried from one call to the next), several rollouts each: verl's reward function and
    tool lifecycle on the prepared rows give the rewards slca's own path gives."""
    from _tok import make_qwen_tokenizer

    from slca.chat import get_format
    from slca.env import toolworld
    from slca.models.tokenizer import chat_template
    from slca.types import ToolCall

    rows, tools = _prepared(tmp_path, n=200)
    tasks = {t.id: t for t in toolworld.make_tasks("train", n=200)}
    chains = [tasks[i] for i in rows if tasks[i].kind == "chain" and any(
        c.name in ("book_flight", "create_event", "book_table") for s in tasks[i].gold for c in s)][:3]
    assert len(chains) >= 2, "no stateful chain tasks among the prepared rows"
    tok = make_qwen_tokenizer(chat_template=chat_template())
    fmt = get_format("hermes")
    compared = 0
    for task in chains:
        steps = [fmt.render(step) for step in task.gold]
        first = task.gold[0][0]
        wrong = [fmt.render([ToolCall(first.name, {k: (v + "x" if isinstance(v, str) else v)
                                                   for k, v in first.arguments.items()})])] + steps[1:]
        answer = task.reference_answer
        for texts in (steps + [answer], steps, wrong + [answer], steps[:1] + ["I could not finish."]):
            v = _verl_rollout(task, rows[task.id], tools, tok, texts)
            t, s = _slca_rollout(task, texts)
            assert v["tool_reward"] == pytest.approx(t) and v["summary_reward"] == pytest.approx(s), (task.id, texts)
            compared += 1
    assert compared >= 8


# ------------------------------------- issue 26 (3): every estimator through verl's registry on verl's layouts

# what each built-in estimator must give on verl's own layout (the score alone at the last valid token, so no
# execution reward): "grpo" = verl's GRPO on every row; "segments" = SLCA's routing of an all-summary reward
# (slca_paper: no process score and the score on the summary, the positional last run; toolpo_grpo: GRPO plus a
# tool advantage of a correct-call ratio that is 0 everywhere here; rltr_planner: the planner reward is the rltr_*
# inputs, all 0 here, and the score is not read: 0 everywhere)
SCORE_ONLY = {"grpo": "grpo", "gdpo": "grpo", "slca": "segments", "slca_cond": "segments", "slca_turn": "segments",
              "slca_paper": "segments", "toolpo_grpo": "grpo", "rltr_planner": "zero", "slca_think": "segments"}


def _default_tokenizer_dir() -> str:
    from slca.models.default import resolve_default_dir

    path, must_build = resolve_default_dir()
    if must_build:
        pytest.skip("the embedded default model is not built here (no shipped weights)")
    return str(path)


def verls_layouts():
    """Rows as verl lays them out: (mask, lengths, score, uids). Groups: a one-token best rollout (the issue's
    case), no-call rows of every length, and truncated rows (ending on a tool response: no summary segment),
    beside complete call-answer rows."""
    rows = [  # (policy/env pattern: 1 policy, 0 tool response; score, group)
        ([1], 0.9, "one"), ([1, 1, 1], 0.1, "one"), ([1, 1, 1, 1, 1], 0.5, "one"), ([1, 1], -0.3, "one"),
        ([1], 0.2, "nocall"), ([1], -0.4, "nocall"), ([1, 1, 1, 1, 1, 1, 1], 0.7, "nocall"), ([1, 1], 0.0, "nocall"),
        ([1, 1, 1, 0, 0], 0.3, "cut"), ([1, 1, 0, 0, 1, 1, 0, 0, 0], 0.6, "cut"), ([1, 1, 0, 1, 1, 1], 0.8, "cut"),
        ([1], -0.2, "cut"),
        ([1, 1, 0, 0, 1, 1], 1.0, "calls"), ([1, 0, 1], 0.4, "calls"), ([1, 1, 1, 0, 1, 1, 0, 1], -0.1, "calls"),
    ]
    T = max(len(p) for p, _, _ in rows) + 1
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (p, _, _) in enumerate(rows):
        mask[i, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p, _, _ in rows])
    score = torch.tensor([s for _, s, _ in rows])
    uids = np.array([g for _, _, g in rows], dtype=object)
    return mask, lengths, score, uids


def _score_at_last_token(score, lengths, T):
    R = torch.zeros(len(score), T)
    R[torch.arange(len(score)), lengths - 1] = score
    return R


def _extras(name, B):
    """What verl's reward_extra_info would carry for an estimator's extra inputs on score-only rows: no tool
    outcome (signature unknown), no per-turn score."""
    needs = slca.get_estimator(name).needs
    out = {}
    if "tool_signatures" in needs:
        out["tool_signatures"] = np.array([None] * B, dtype=object)
    if "turn_rewards" in needs:
        out["turn_rewards"] = np.full((B, 1), np.nan, dtype=np.float32)
    for n in ("should_no_call", "toolpo_correct_ratio", "rltr_comp", "rltr_repeat_penalty", "rltr_error_penalty"):
        if n in needs:
            out[n] = np.zeros(B, dtype=np.float32)
    if "rltr_format_valid" in needs:
        out["rltr_format_valid"] = np.ones(B, dtype=np.float32)
    assert set(out) == set(needs) - {"span_labels"}, f"{name} needs {needs}: add them here"  # span labels: from batch=
    return out or None


def test_every_registered_estimator_is_covered():
    assert set(slca.list_estimators()) <= set(SCORE_ONLY), "a new built-in estimator: say what it gives on verl's layout"


@pytest.mark.parametrize("mode", ["response", "include", "exclude"])
@pytest.mark.parametrize("name", sorted(SCORE_ONLY))
def test_every_estimator_on_verls_layouts_through_verls_registry(monkeypatch, name, mode):
    """verl's layout, every estimator, every SLCA_EMPTY_TOOL mode, through ``get_adv_estimator_fn``: the score is
    the summary reward (no execution reward is read out of it, whatever the response's length); a group's best
    rollout gets its largest advantage when no call was made; no token's advantage has the sign opposite to
    verl's GRPO; "include" / "exclude" equal verl's GRPO on rows without a tool segment, and grpo / gdpo
    equal it everywhere."""
    mask, lengths, score, uids = verls_layouts()
    R = _score_at_last_token(score, lengths, mask.shape[1])
    expect, _ = core_algos.compute_grpo_outcome_advantage(R, mask, uids)
    monkeypatch.setenv("SLCA_ESTIMATOR", name)
    monkeypatch.setenv("SLCA_EMPTY_TOOL", mode)
    fn = core_algos.get_adv_estimator_fn("slca")
    batch = None
    if "span_labels" in slca.get_estimator(name).needs:  # slca_think: token ids (verl's newer batch=) and a tokenizer
        monkeypatch.setenv("SLCA_TOKENIZER", _default_tokenizer_dir())
        batch = {"responses": torch.full(mask.shape, 65, dtype=torch.long)}  # plain text: no reasoning, as verl's rows
    got, ret = fn(token_level_rewards=R, response_mask=mask, index=uids, config=AlgoConfig(adv_estimator="slca"),
                  non_tensor_batch=_extras(name, len(uids)), batch=batch)
    assert torch.equal(got, ret)
    t, s = sv.unpack_token_rewards(R, mask)
    assert torch.equal(t, torch.zeros(len(uids))) and torch.equal(s, score)  # the 1-token rows too
    if SCORE_ONLY[name] == "grpo":
        torch.testing.assert_close(got, expect)
        return
    if SCORE_ONLY[name] == "zero":
        assert torch.equal(got, torch.zeros_like(got))
        return
    assert (got * expect >= 0).all() and (got.abs() <= expect.abs() + 1e-6).all()  # never the opposite sign
    tool_seg, _ = slca.segment_masks(mask)
    no_tool = ~tool_seg.bool().any(1)
    if mode != "response":
        torch.testing.assert_close(got[no_tool], expect[no_tool])
    per_row = got.sum(1) / mask.sum(1)
    for g in ("one", "nocall"):  # groups where no call was made
        rows = np.flatnonzero(uids == g)
        assert rows[int(per_row[rows].argmax())] == rows[int(score[rows].argmax())], (g, per_row[rows])
    one = int(np.flatnonzero(uids == "one")[0])  # the row: 1 token, score 0.9, the best of its group
    assert got[one, 0] > 0 and (mode == "response" or got[one, 0] == pytest.approx(float(expect[one, 0]), abs=1e-5))


@pytest.mark.parametrize("name", sorted(n for n in SCORE_ONLY if not slca.get_estimator(n).needs))
def test_verls_dispatch_on_verls_layout_with_one_token_responses(monkeypatch, name):
    """The same through verl's own ``compute_advantage`` (which passes no reward_extra_info to a registered
    estimator): the 1-token best rollout is positive and equals verl's GRPO under "include"."""
    mask, lengths, score, uids = verls_layouts()
    R = _score_at_last_token(score, lengths, mask.shape[1])
    monkeypatch.setenv("SLCA_ESTIMATOR", name)
    monkeypatch.setenv("SLCA_EMPTY_TOOL", "include")
    data = DataProto.from_dict(tensors={"token_level_rewards": R, "response_mask": mask}, non_tensors={"uid": uids})
    got = compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca")).batch["advantages"]
    grpo = compute_advantage(data, adv_estimator="grpo", config=AlgoConfig(adv_estimator="grpo")).batch["advantages"]
    no_tool = ~slca.segment_masks(mask)[0].bool().any(1)
    torch.testing.assert_close(got[no_tool], grpo[no_tool])
    assert got[0, 0] > 0


def test_one_token_rows_round_trip_both_rewards():
    """slca's own layout keeps both rewards of a one-token response (a policy token and nothing else, or padded by
    one masked token as the agent loop does), and verl's layout of the same rows still reads as score-only."""
    mask = torch.tensor([[1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 0, 1]])
    lengths = torch.tensor([1, 2, 2, 3])
    r_tool, r_sum = torch.tensor([0.7, -0.2, 0.3, 0.1]), torch.tensor([-0.5, 0.4, 0.9, 0.6])
    R = sv.pack_token_rewards(r_tool, r_sum, mask, lengths)
    t, s = sv.unpack_token_rewards(R, mask)
    torch.testing.assert_close(t, r_tool)
    torch.testing.assert_close(s, r_sum)
    assert R[0, 0] == r_sum[0] and R[2, 1] == r_sum[2] and R[3, 2] == r_sum[3]  # where verl puts its score
    assert R[1].tolist() == pytest.approx([0.4, -0.2, 0.0])  # padded one-token response: summary on its token
    # verl's layout of the rows verl makes (a one-token response is not padded there) reads as score-only
    rows = [0, 2, 3]
    t, s = sv.unpack_token_rewards(_score_at_last_token(r_sum[rows], lengths[rows], 3), mask[rows])
    assert torch.equal(t, torch.zeros(3)) and torch.equal(s, r_sum[rows])
    # a one-token response in a batch one token wide: verl's score reads as summary; slca's two rewards cannot fit
    t, s = sv.unpack_token_rewards(torch.tensor([[0.9]]), torch.tensor([[1]]))
    assert t.item() == 0.0 and s.item() == pytest.approx(0.9)


def test_verl_refuses_the_mask_check_threshold_without_the_checks(monkeypatch):
    """The mask check's results are made by slca's agent loop (slca_tool_agent) and reach the estimator with the rows;
    setting its threshold for a batch that carries none (another agent loop) is refused with the reason, not ignored
    (docs/training.md, masks checked against the conversation)."""
    from slca.integrations import verl as V

    monkeypatch.setenv(V.MASK_CHECK_ENV, "0.1")
    with pytest.raises(ValueError, match="carries no mask check: slca's agent loop makes it.*slca_tool_agent"):
        V.compute_slca_outcome_advantage(torch.zeros(2, 3), torch.ones(2, 3), index=["a", "a"])


def test_span_labels_under_verl_need_the_token_ids_and_a_tokenizer(monkeypatch):
    """SLCA_SEGMENTATION=span and SLCA_ESTIMATOR=slca_think read batch['responses'] (verl's newer batch=, upstream PR
    #7473) with SLCA_TOKENIZER; verl 0.9.1 passes no ids: refused in one line saying so, as a missing tokenizer is."""
    from transformers import AutoTokenizer

    from slca.core.segments import span_segment_masks

    path = _default_tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(path)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    turn = tok("Let me check.\n<tool_call>\n[{\"name\": \"f\", \"arguments\": {}}]\n</tool_call>", add_special_tokens=False)["input_ids"] + [eot]
    env = tok("<tool_response>{}</tool_response>", add_special_tokens=False)["input_ids"]
    ans = tok("Done.", add_special_tokens=False)["input_ids"] + [eot]
    ids = torch.tensor([turn + env + ans] * 2)
    mask = torch.tensor([[1] * len(turn) + [0] * len(env) + [1] * len(ans)] * 2)
    uids = np.array(["a", "a"], dtype=object)
    ntb = {"tool_reward": np.array([0.0, 1.0], dtype=np.float32), "summary_reward": np.array([1.0, 0.0], dtype=np.float32)}
    R = torch.zeros(mask.shape)
    fn = core_algos.get_adv_estimator_fn("slca")
    monkeypatch.setenv("SLCA_SEGMENTATION", "span")
    with pytest.raises(ValueError, match="not handed: it reads batch\\['responses'\\] from verl's compute_advantage.*PR #7473"):
        fn(token_level_rewards=R, response_mask=mask, index=uids, non_tensor_batch=ntb)
    with pytest.raises(ValueError, match="set SLCA_TOKENIZER"):
        fn(token_level_rewards=R, response_mask=mask, index=uids, non_tensor_batch=ntb, batch={"responses": ids})
    monkeypatch.setenv("SLCA_TOKENIZER", path)
    got, _ = fn(token_level_rewards=R, response_mask=mask, index=uids, non_tensor_batch=ntb, batch={"responses": ids})
    labels = sv.span_inputs({"responses": ids}, mask)
    tm, sm = span_segment_masks(*slca.segment_masks(mask), labels)
    assert tm.sum() < slca.segment_masks(mask)[0].sum()  # "Let me check." left the execution segment
    torch.testing.assert_close(got, slca.slca_advantages(ntb["tool_reward"], ntb["summary_reward"], [0, 0], tm, sm))
    # verl 0.9.1's own compute_advantage passes no batch= to it: the estimator reads the ids from the batch it holds
    data = DataProto.from_dict(tensors={"token_level_rewards": R, "response_mask": mask, "responses": ids},
                               non_tensors={"uid": uids, **ntb})
    via_verl = compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca")).batch["advantages"]
    torch.testing.assert_close(via_verl, got)
    monkeypatch.setenv("SLCA_TOOL_FORMAT", "openai")
    with pytest.raises(ValueError, match="SLCA_SEGMENTATION='span', SLCA_TOOL_FORMAT='openai'"):
        fn(token_level_rewards=R, response_mask=mask, index=uids, non_tensor_batch=ntb, batch={"responses": ids})
