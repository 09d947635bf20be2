"""slca's own rows (``format="slca"``; the layout: :mod:`slca.env.loaders` and docs/environment.md)."""

from __future__ import annotations

from typing import Any

from slca.env.rows.fields import as_dict, check_gold, decoded, gold_steps, lift_fields, row_facts, row_field, row_id, row_kind, row_messages, row_tools, toolbox, with_name_only
from slca.types import Task


def from_slca(row: dict[str, Any], index: int) -> Task:
    tools = row_tools(row_field(row, "tools"), "tools")
    gold, paths, name_only = gold_steps(row_field(row, "gold"), "gold")
    check_gold(toolbox(tools, "tools"), gold, paths, name_only)
    meta, fields = lift_fields(as_dict(decoded(row.get("meta") or {}, "meta"), "meta"), "meta")
    meta = with_name_only(meta, name_only)
    return Task(
        id=row_id(row_field(row, "id"), "id") or f"slca-{index}",
        messages=row_messages(row_field(row, "messages"), "messages"),
        tools=tools,
        gold=gold,
        kind=row_kind(row.get("kind"), "kind", "single"),
        answer_facts=row_facts(row.get("answer_facts"), "answer_facts"),
        meta=meta,
        **fields,
    )
