"""The paper's released ``rl`` / ``eval`` rows and the rows its converters write (``format="paper"``; the layout:
:mod:`slca.env.loaders`)."""

from __future__ import annotations

import json
from typing import Any

from slca.env.rows.fields import BadValue, GT, Gold, as_dict, as_list, check_gold, check_items, decoded, gold_step, ground_truth, kind_of, row_facts, row_field, row_id, row_kind, row_messages, row_tools, toolbox, with_name_only
from slca.types import Task


PAPER_SOURCES = ("toucan_toolcall_v4_rl", "toucan_eval_v4")
"""``data_source`` values of the paper's released ``rl`` / ``eval`` rows: ``format="auto"`` reads them as ``paper``."""
CONVERTER_SOURCES = ("toucan_toolcall",)
"""``data_source`` of the rows the authors' converters write (``data/convert_toucan_to_verl.py`` / ``_v2.py`` of
``SLCA-GRPO/SLCA-GRPO``, and their RL preview): ``format="auto"`` reads them as ``paper`` too."""


def _paper_steps(value: Any, field: str) -> Gold:
    """Gold as the authors' reward reads it: nested if the first item is a list, else ONE step of parallel calls;
    an item is a ``{name, arguments}`` object or a bare tool name (module docstring)."""
    gold = as_list(decoded(value, field), field)
    out: Gold = ([], [], [])
    if not gold:
        return out
    for i, item in enumerate(gold):
        if not isinstance(item, (str, dict, list, tuple)):
            raise BadValue(f"{field}[{i}]", f"must be a call object, a tool name or a step (a list of them), got {type(item).__name__}")
    if isinstance(gold[0], (list, tuple)):
        for s, step in enumerate(gold):
            f = f"{field}[{s}]"
            if not isinstance(step, (list, tuple)):
                raise BadValue(f, f"must be a step (a list of calls) like step 0, got {type(step).__name__}: the authors' reward "
                              "would skip it, slca does not drop a gold step")
            check_items(step, f)
            gold_step(list(step), f, s, out)
    else:
        check_items(gold, field)
        gold_step(gold, field, 0, out)  # one step: its calls' paths are gold_tool_calls[i]
    return out


# ---------------------------------------------------------------- the paper's released rl / eval rows


def _paper_tools(row: dict[str, Any], gt: dict[str, Any]) -> list[dict[str, Any]]:
    """``tools`` (what the model is shown), else ``ground_truth.tool_schemas``; both: they must name the same tools."""
    if row.get("tools") is None:
        return row_tools(row_field(gt, "tool_schemas", f"{GT}.tool_schemas"), f"{GT}.tool_schemas")
    tools = row_tools(row["tools"], "tools")
    if gt.get("tool_schemas") is not None:
        names = sorted(t["function"]["name"] for t in tools)
        other = sorted(t["function"]["name"] for t in row_tools(gt["tool_schemas"], f"{GT}.tool_schemas"))
        if names != other:
            raise BadValue(f"{GT}.tool_schemas", f"names the tools {other[:8]}, the column 'tools' {names[:8]}: "
                                              "slca cannot tell which set the rollout offers")
    return tools


def _names(value: Any, field: str, offered: list[str]) -> list[str]:
    """``allowed_tools``: a list of tool names (a JSON string of one is decoded), each one of ``offered``."""
    out = []
    for i, n in enumerate(as_list(decoded(value, field), field)):
        if not isinstance(n, str):
            raise BadValue(f"{field}[{i}]", f"must be a tool name string, got {type(n).__name__}")
        if n not in offered:
            raise BadValue(f"{field}[{i}]", f"{n!r} is not among the row's tools {offered[:8]}")
        out.append(n)
    return out


def _typed(extra: dict[str, Any], key: str, types: tuple[type, ...], what: str) -> Any:
    """``extra_info[key]`` if it is None or one of ``types`` (bool is never an int here)."""
    v = extra.get(key)
    if v is None or (isinstance(v, types) and not (isinstance(v, bool) and bool not in types)):
        return v
    raise BadValue(f"extra_info.{key}", f"must be {what} or null, got {type(v).__name__} {v!r:.40}")


def _paper_id(data_source: str, extra: dict[str, Any], index: int) -> str:
    """``<data_source>-<original_idx>`` (``-t<turn_index>`` / ``-s<split_position>`` for decomposed multi-turn rows)."""
    idx = row_id(extra.get("original_idx"), "extra_info.original_idx")
    if idx is None:
        return f"{data_source}-row{index}"
    tid = f"{data_source}-{idx}"
    if extra.get("turn_index") is not None:
        tid += f"-t{extra['turn_index']}"
    if extra.get("split_position") is not None:
        tid += f"-s{extra['split_position']}"
    return tid


_V1_HEAD = "You have access to the following tools:\n\n"
_V1_TAIL = "\n\nUse them when appropriate to help answer the user's questions."
_QWEN_TOOLS = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{}\n</tools>\n\n"
               "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
               "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>")


def _declared(raw_tools: Any) -> str | None:
    """The ``<tools>`` body the authors' converters write for these tools (one JSON object a line), or None."""
    if not isinstance(raw_tools, list) or not all(isinstance(t, dict) for t in raw_tools):
        return None
    try:
        return "".join("\n" + json.dumps(t if t.get("type") == "function" else {"type": "function", "function": t},
                                          ensure_ascii=False) for t in raw_tools)
    except (TypeError, ValueError):
        return None


def _drop_declaration(prompt: list[dict[str, Any]], raw_tools: Any) -> tuple[list[dict[str, Any]], bool]:
    """The prompt without the converters' own tool declaration (module docstring), and whether one was there.

    Only their exact text for the row's own tools is recognised: v1's system message that is nothing but the
    declaration is dropped; v2's trailing ``# Tool Definitions`` block is cut. Any other system text is kept."""
    body = _declared(raw_tools)
    if body is None or not prompt or prompt[0]["role"] != "system":
        return prompt, False
    system = prompt[0]["content"]
    if system == _V1_HEAD + _QWEN_TOOLS.format(body) + _V1_TAIL and len(prompt) > 1:
        return prompt[1:], True
    v2 = f"\n\n# Tool Definitions\n<tools>{body}\n</tools>"
    if system.endswith(v2) and system[:-len(v2)].strip():
        return [{**prompt[0], "content": system[:-len(v2)]}] + prompt[1:], True
    return prompt, False


def from_paper(row: dict[str, Any], index: int) -> Task:
    prompt = row_messages(row_field(row, "prompt"), "prompt")
    source = row_kind(row.get("data_source"), "data_source", "paper")
    gt = ground_truth(row)
    tools = _paper_tools(row, gt)
    offered = [t["function"]["name"] for t in tools]
    allowed = _names(row_field(gt, "allowed_tools", f"{GT}.allowed_tools"), f"{GT}.allowed_tools", offered)
    gold, paths, name_only = _paper_steps(row_field(gt, "gold_tool_calls", f"{GT}.gold_tool_calls"), f"{GT}.gold_tool_calls")
    check_gold(toolbox(tools, "tools"), gold, paths, name_only)
    for step, ps in zip(gold, paths):
        for call, p in zip(step, ps):
            if call.name not in allowed:
                raise BadValue(p, f"gold call to {call.name!r}, which allowed_tools {allowed[:8]} does not allow")
    question = gt.get("question_content")
    if question is not None and not isinstance(question, str):
        raise BadValue(f"{GT}.question_content", f"must be a string, got {type(question).__name__}")
    extra = as_dict(decoded(row.get("extra_info") or {}, "extra_info"), "extra_info")
    subset_name = gt.get("subset_name")
    if subset_name is not None and not isinstance(subset_name, str):
        raise BadValue(f"{GT}.subset_name", f"must be a string, got {type(subset_name).__name__}")
    meta: dict[str, Any] = {
        "source": "paper", "data_source": source, "question": question, "allowed_tools": allowed,
        "parallel_type": _typed(extra, "parallel_type", (str,), "a string"),
        "has_history": _typed(extra, "has_history", (bool,), "true / false"),
        "turn_index": _typed(extra, "turn_index", (int,), "an integer"),
        "split_position": _typed(extra, "split_position", (int, str), "an integer or a string"),
        # e.g. native_single_turn: the eval's group_by="subset"; the converters' rows have only subset_name
        "subset": _typed(extra, "source", (str,), "a string") or subset_name,
        "extra_info": extra,
    }
    if subset_name is not None:  # the converters' rows: tool_call / irrelevant
        meta["subset_name"] = subset_name
    if "original_turn_index" in extra:
        meta["original_turn_index"] = _typed(extra, "original_turn_index", (int,), "an integer")
    raw_tools = row["tools"] if row.get("tools") is not None else gt.get("tool_schemas")
    prompt, dropped = _drop_declaration(prompt, decoded(raw_tools, "tools"))
    if dropped:
        meta["tool_declare_dropped"] = True
    return Task(id=_paper_id(source, extra, index), messages=prompt, tools=tools, gold=gold, kind=kind_of(gold),
                answer_facts=row_facts(gt.get("answer_facts"), f"{GT}.answer_facts"), meta=with_name_only(meta, name_only))
