"""The paper's verl-native rows (``format="verl"``; the layout: :mod:`slca.env.loaders`)."""

from __future__ import annotations

from typing import Any

from slca.env.rows.fields import GT, as_dict, check_gold, decoded, gold_steps, ground_truth, kind_of, lift_fields, row_facts, row_field, row_id, row_kind, row_messages, row_tools, toolbox, with_name_only
from slca.types import Task


def _verl_id(row: dict[str, Any], extra: dict[str, Any]) -> str | None:
    tid = None
    for name, v in (("uuid", row.get("uuid")), ("id", row.get("id")), ("extra_info.uuid", extra.get("uuid")), ("extra_info.index", extra.get("index"))):
        tid = tid or row_id(v, name)
    return tid


def from_verl(row: dict[str, Any], index: int) -> Task:
    prompt = row_messages(row_field(row, "prompt"), "prompt")
    tools = row_tools(row_field(row, "tools"), "tools")
    gt = ground_truth(row)
    gold, paths, name_only = gold_steps(row_field(gt, "gold_tool_calls", f"{GT}.gold_tool_calls"), f"{GT}.gold_tool_calls")
    check_gold(toolbox(tools, "tools"), gold, paths, name_only)
    extra = as_dict(decoded(row.get("extra_info") or {}, "extra_info"), "extra_info")
    extra_meta = as_dict(decoded(extra.get("meta") or {}, "extra_info.meta"), "extra_info.meta")  # the task's own meta, if the row carries it
    extra_meta, fields = lift_fields(extra_meta, "extra_info.meta")
    meta = with_name_only({**extra_meta, "source": "verl", "data_source": row.get("data_source"), "extra_info": extra}, name_only)
    return Task(id=_verl_id(row, extra) or f"verl-{index}", messages=prompt, tools=tools, gold=gold,
                kind=row_kind(extra.get("kind"), "extra_info.kind", kind_of(gold)),
                answer_facts=row_facts(gt.get("answer_facts"), f"{GT}.answer_facts"), meta=meta, **fields)
