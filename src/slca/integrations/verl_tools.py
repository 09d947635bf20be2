"""A verl tool backed by slca's environment: toolworld's Python world for its own tools, the schema-guided simulator otherwise.

Referenced from verl's tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``;
``examples/verl/prepare_data.py`` writes one for the toolworld tools)::

    tools:
      - class_name: slca.integrations.verl_tools.SLCASimulatedTool
        config: {type: native, seed: 0}
        tool_schema: {type: function, function: {name: get_weather, ...}}

Being part of the package, it imports in every Ray worker that has slca installed.
"""

from __future__ import annotations

import uuid
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from slca.env.toolworld import TOOLS, make_env
from slca.types import Task

__all__ = ["SLCASimulatedTool"]

_TOOLWORLD = {t["function"]["name"]: t for t in TOOLS}


class SLCASimulatedTool(BaseTool):
    """Answers each call with :func:`slca.env.toolworld.make_env`'s simulator (state kept per rollout)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        schema = tool_schema.model_dump(exclude_none=True)
        spec = _TOOLWORLD.get(self.name, schema)
        self._sim = make_env(Task(id=self.name, messages=[], tools=[spec]), seed=int(config.get("seed", 0)))

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid.uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        result = self._sim.call(self.name, parameters, episode=instance_id)
        return ToolResponse(text=result.to_text()), 0.0, {"ok": result.ok}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None
