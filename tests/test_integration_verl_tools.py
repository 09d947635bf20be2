"""slca.integrations.verl_tools: a verl tool answered by slca's environment, its state kept per trajectory.

Runs in the verl environment (.venv-verl; the verl line of ``make test``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")

from verl.tools.schemas import OpenAIFunctionToolSchema  # noqa: E402

from slca.env.toolworld import TOOLS  # noqa: E402
from slca.integrations import verl_tools  # noqa: E402
from slca.integrations.verl_tools import SLCASimulatedTool  # noqa: E402

from test_integration_verl import _agent_data, _call, _Loop, _prepared  # noqa: E402


def test_verl_tool_answers_from_slca_and_keeps_state_per_instance(tmp_path):
    import asyncio

    import yaml
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from slca.env.toolworld import TOOLS, make_env
    from slca.integrations.verl_tools import SLCASimulatedTool
    from slca.types import Task

    spec = next(t for t in TOOLS if t["function"]["name"] == "get_weather")
    schema = {"type": "function", "function": {k: spec["function"][k] for k in ("name", "description", "parameters")}}
    tool = SLCASimulatedTool({"type": "native", "seed": 0}, OpenAIFunctionToolSchema.model_validate(schema))
    iid, _ = asyncio.run(tool.create())
    args = {"city": "Sofia", "date": "2025-07-16"}
    resp, reward, info = asyncio.run(tool.execute(iid, args))
    assert resp.text == make_env(Task(id="t", messages=[], tools=[spec])).call("get_weather", args).to_text()
    assert info == {"ok": True} and reward == 0.0
    bad, _, info = asyncio.run(tool.execute(iid, {"city": "Sofia"}))
    assert info == {"ok": False} and "error" in bad.text
    asyncio.run(tool.release(iid))
    # the example's data preparation writes a tool config that names this class
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "examples" / "verl" / "prepare_data.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True, capture_output=True, timeout=120)
    cfg = yaml.safe_load((tmp_path / "tool_config.yaml").read_text())
    assert {t["class_name"] for t in cfg["tools"]} == {"slca.integrations.verl_tools.SLCASimulatedTool"}
    assert (tmp_path / "train.parquet").exists()


def test_tool_state_lives_per_trajectory_through_verls_call_lifecycle(tmp_path):
    """verl creates, executes and releases a tool instance per call; state must still hold across calls and tools
    of one trajectory, and not leak into another."""
    from slca.integrations import verl_tools

    _, tools = _prepared(tmp_path, n=4)
    loop = _Loop(tools)
    instances_before = dict(verl_tools._BY_INSTANCE)
    a, b = _agent_data([{"role": "user", "content": "a"}]), _agent_data([{"role": "user", "content": "b"}])
    created = json.loads(_call(loop, a, "create_event", {"title": "yoga", "date": "2025-07-16"}))
    listed = json.loads(_call(loop, a, "list_events", {"date": "2025-07-16"}))
    assert created["status"] == "created" and listed["events"] == ["yoga"]
    assert json.loads(_call(loop, b, "list_events", {"date": "2025-07-16"}))["events"] == []  # another trajectory
    flights = json.loads(_call(loop, a, "search_flights", {"origin": "Paris", "destination": "Rome", "date": "2025-07-16"}))
    fid = flights["flight_id"]
    booking = json.loads(_call(loop, a, "book_flight", {"flight_id": fid, "passenger": "Anna"}))
    got = json.loads(_call(loop, a, "get_booking", {"booking_id": booking["booking_id"]}))
    assert got.get("flight_id") == fid and "error" not in got
    assert "error" in json.loads(_call(loop, b, "get_booking", {"booking_id": booking["booking_id"]}))
    n = len(verl_tools._BY_TRAJECTORY)
    del a
    import gc

    gc.collect()
    assert len(verl_tools._BY_TRAJECTORY) == n - 1  # the trajectory's state goes with verl's AgentData
    assert verl_tools._BY_INSTANCE == instances_before  # every per-call instance was released


def _tool(name, seed=0, schema=None):
    if schema is None:
        spec = next(t for t in TOOLS if t["function"]["name"] == name)
        schema = {"type": "function", "function": {k: spec["function"][k] for k in ("name", "description", "parameters")}}
    return SLCASimulatedTool({"type": "native", "seed": seed}, OpenAIFunctionToolSchema.model_validate(schema))


class _Trajectory:
    """Stands for verl's AgentData: any object the tool can hold weakly."""


def _execute(tool, iid, args, agent_data=None):
    kw = {} if agent_data is None else {"agent_data": agent_data}
    resp, reward, info = asyncio.run(tool.execute(iid, args, **kw))
    return json.loads(resp.text), reward, info


def test_create_keeps_the_given_id_or_makes_one_and_the_reward_is_zero():
    tool = _tool("get_weather")
    iid, resp = asyncio.run(tool.create("mine"))
    assert iid == "mine" and resp.text is None
    fresh, _ = asyncio.run(tool.create())
    assert uuid.UUID(fresh) and fresh != iid
    assert asyncio.run(tool.calc_reward(iid)) == 0.0
    assert tool.spec["function"]["name"] == "get_weather" and tool.spec in TOOLS  # toolworld's own schema, response included


def test_state_is_shared_by_the_tools_of_one_trajectory_and_kept_from_others():
    create, listing = _tool("create_event"), _tool("list_events")
    a, b = _Trajectory(), _Trajectory()
    created, reward, info = _execute(create, "c1", {"title": "yoga", "date": "2025-07-16"}, a)
    assert created["status"] == "created" and reward == 0.0 and info == {"ok": True}
    asyncio.run(create.release("c1"))  # verl releases each call's instance: the trajectory's state stays
    assert _execute(listing, "l1", {"date": "2025-07-16"}, a)[0]["events"] == ["yoga"]
    assert _execute(listing, "l2", {"date": "2025-07-16"}, b)[0]["events"] == []
    assert create.simulator("any", a) is listing.simulator("other", a) is not listing.simulator("x", b)


def test_without_agent_data_the_state_lives_per_instance_until_release():
    create, listing = _tool("create_event"), _tool("list_events")
    _execute(create, "inst-1", {"title": "run", "date": "2025-07-17"})
    assert _execute(listing, "inst-1", {"date": "2025-07-17"})[0]["events"] == ["run"]
    assert _execute(listing, "inst-2", {"date": "2025-07-17"})[0]["events"] == []
    asyncio.run(listing.release("inst-1"))
    assert "inst-1" not in verl_tools._BY_INSTANCE
    assert _execute(listing, "inst-1", {"date": "2025-07-17"})[0]["events"] == []  # a new instance starts afresh
    asyncio.run(listing.release("inst-1"))
    asyncio.run(listing.release("inst-2"))


def test_a_tool_toolworld_does_not_have_is_answered_by_the_schema_simulator():
    schema = {"type": "function", "function": {
        "name": "lookup_sku", "description": "Stock of a product.",
        "parameters": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}}}
    tool = _tool("lookup_sku", schema=schema)
    got, _, info = _execute(tool, "s1", {"sku": "A-1"}, _Trajectory())
    assert info == {"ok": True} and isinstance(got, dict)
    bad, _, info = _execute(tool, "s1", {}, _Trajectory())  # its schema is checked: a readable error for the model
    assert info == {"ok": False} and "sku" in json.dumps(bad)
