"""A verl tool backed by slca's environment: toolworld's Python world for its own tools, the schema-guided simulator otherwise.

Referenced from verl's tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``;
``examples/verl/prepare_data.py`` writes one for the toolworld tools)::

    tools:
      - class_name: slca.integrations.verl_tools.SLCASimulatedTool
        config: {type: native, seed: 0}
        tool_schema: {type: function, function: {name: get_weather, ...}}

Being part of the package, it imports in every Ray worker that has slca installed.

State per trajectory
    verl 0.9.1's ``ToolAgentLoop`` holds one instance per tool *name* and drives
    every single call as ``create() -> execute(instance_id, args,
    agent_data=...) -> release(instance_id)``; the instance id lives for one
    call only. A rollout's state (``create_event`` then ``list_events``,
    ``book_flight`` then ``get_booking``) must therefore outlive the call and be
    shared by all the tools of the rollout. Each trajectory gets one simulator
    (:func:`slca.env.toolworld.make_env` over every tool of the config), kept
    with verl's ``AgentData`` of that trajectory (weakly: it goes when verl
    drops the trajectory). A driver that passes no ``agent_data`` (one
    ``create`` per trajectory, then calls with its instance id) gets the state
    per instance id instead, dropped at ``release``.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from slca.env.toolworld import TOOLS, make_env
from slca.types import Task

__all__ = ["SLCASimulatedTool"]

_TOOLWORLD = {t["function"]["name"]: t for t in TOOLS}
# every tool schema instantiated in this process, by name: a trajectory's simulator answers all of them
_SCHEMAS: dict[str, dict[str, Any]] = {}
# trajectory -> its simulator (verl's AgentData, weakly), or instance id -> simulator (drivers without agent_data)
_BY_TRAJECTORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BY_INSTANCE: dict[str, Any] = {}


class SLCASimulatedTool(BaseTool):
    """Answers each call with the trajectory's slca simulator (see the module docstring for the lifecycle)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        schema = tool_schema.model_dump(exclude_none=True)
        self.spec = _TOOLWORLD.get(self.name, schema)
        _SCHEMAS[self.name] = self.spec
        self.seed = int(config.get("seed", 0))

    def _new_simulator(self):
        return make_env(Task(id="verl-trajectory", messages=[], tools=list(_SCHEMAS.values())), seed=self.seed)

    def simulator(self, instance_id: str, agent_data: Any = None):
        """The simulator of the trajectory ``agent_data`` belongs to (or of ``instance_id`` without one)."""
        if agent_data is not None:
            sim = _BY_TRAJECTORY.get(agent_data)
            if sim is None:
                sim = _BY_TRAJECTORY[agent_data] = self._new_simulator()
            return sim
        if instance_id not in _BY_INSTANCE:
            _BY_INSTANCE[instance_id] = self._new_simulator()
        return _BY_INSTANCE[instance_id]

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid.uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        sim = self.simulator(instance_id, kwargs.get("agent_data"))
        result = sim.call(self.name, parameters)
        return ToolResponse(text=result.to_text()), 0.0, {"ok": result.ok}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        # a trajectory's state stays with its agent_data; only per-instance state ends here
        _BY_INSTANCE.pop(instance_id, None)
