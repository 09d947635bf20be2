"""Toucan-1.5M rows as published (``format="toucan"``; the layout: :mod:`slca.env.loaders`)."""

from __future__ import annotations

from typing import Any

from slca.env.rows.fields import BadValue, as_dict, as_list, check_gold, decoded, kind_of, parse_target_tools, row_call, row_field, row_id, row_kind, row_messages, row_tools, toolbox
from slca.types import Task, ToolCall


TOUCAN_SUBSETS = ("single-turn-original", "single-turn-diversify", "irrelevant", "multi-turn")
TOOL_DECLARE = "<|im_system|>tool_declare<|im_middle|>"


def toucan_tools(row: dict[str, Any], msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools offered: ``available_tools``, else ``tools``, else a tool_declare system message, else ``metadata``."""
    for col in ("available_tools", "tools"):
        if row.get(col) is not None:
            return row_tools(row[col], col)
    for i, m in enumerate(msgs):
        if m["role"] == "system" and m["content"].startswith(TOOL_DECLARE):
            body = m["content"][len(TOOL_DECLARE):].split("<|im_end|>")[0]
            return row_tools(body, f"messages[{i}].content")
    if row.get("metadata") is not None:
        meta = as_dict(decoded(row["metadata"], "metadata"), "metadata")
        tools = []
        for s, server in enumerate(as_list(meta.get("mcp_servers") or [], "metadata.mcp_servers")):
            f = f"metadata.mcp_servers[{s}]"
            server = as_dict(server, f)
            prefix = str(server.get("server_name") or "").lower().replace(" ", "-")
            resp = as_dict(server.get("remote_server_response") or {}, f"{f}.remote_server_response")
            for t, tool in enumerate(as_list(resp.get("tools") or [], f"{f}.remote_server_response.tools")):
                tf = f"{f}.remote_server_response.tools[{t}]"
                tool = as_dict(tool, tf)
                if not isinstance(tool.get("name"), str):
                    raise BadValue(f"{tf}.name", f"must be a string, got {tool.get('name')!r:.40}")
                tools.append({"name": f"{prefix}-{tool['name']}" if prefix else tool["name"], "description": tool.get("description"),
                              "parameters": tool.get("input_schema")})
        return row_tools(tools, "metadata.mcp_servers[].remote_server_response.tools")
    raise BadValue("available_tools", "missing, and no tools / tool_declare system message / metadata.mcp_servers to take them from")


def _requests(msgs: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    """Split the conversation from ``start`` at each user message: each request's calls, results and answer."""
    out: list[dict[str, Any]] = []
    cur = {"user": None, "steps": [], "paths": [], "results": [], "answer": "", "run": [], "run_paths": []}

    def close() -> None:
        if cur["run"]:
            cur["steps"].append(cur["run"])
            cur["paths"].append(cur["run_paths"])
            cur["run"], cur["run_paths"] = [], []

    for j in range(start, len(msgs)):
        m = msgs[j]
        f = f"messages[{j}]"
        if m["role"] == "user":
            close()
            out.append(cur)
            cur = {"user": m["content"], "steps": [], "paths": [], "results": [], "answer": "", "run": [], "run_paths": []}
            continue
        if m["role"] in ("function", "tool"):  # a result ends the step: later calls saw it
            close()
            cur["results"].append(m.get("content"))
            continue
        if m["role"] != "assistant":
            raise BadValue(f"{f}.role", f"a {m['role']} message after the conversation started is not supported")
        calls = []
        if "function_call" in m:
            calls.append((row_call(m["function_call"], f"{f}.function_call"), f"{f}.function_call"))
        if "tool_calls" in m:
            for k, tc in enumerate(as_list(m["tool_calls"], f"{f}.tool_calls")):
                tf = f"{f}.tool_calls[{k}]"
                tc = as_dict(tc, tf)
                if "function" in tc:
                    tf, tc = f"{tf}.function", tc["function"]
                calls.append((row_call(tc, tf), tf))
        if calls:
            cur["run"] += [c for c, _ in calls]
            cur["run_paths"] += [p for _, p in calls]
        elif isinstance(m.get("content"), str) and m["content"].strip():  # text (not reasoning alone) ends the step
            close()
            cur["answer"] = m["content"].strip()
    close()
    out.append(cur)
    return out


def _resolve_names(steps: list[list[ToolCall]], names: list[str]) -> dict[str, str]:
    """Rename a call whose name is not offered but is the bare name of exactly one offered ``<server>-<name>`` tool."""
    renamed: dict[str, str] = {}
    for step in steps:
        for i, c in enumerate(step):
            if c.name in names:
                continue
            cands = [n for n in names if n.endswith("-" + c.name)]
            if len(cands) == 1:
                renamed[c.name] = cands[0]
                step[i] = ToolCall(cands[0], c.arguments)
    return renamed


def from_toucan(row: dict[str, Any], index: int) -> Task:
    msgs = row_messages(row_field(row, "messages"), "messages")
    tools = toucan_tools(row, msgs)
    names = [t["function"]["name"] for t in tools]
    first = next((i for i, m in enumerate(msgs) if m["role"] not in ("system", "user")), len(msgs))
    declared = any(m["role"] == "system" and m["content"].startswith(TOOL_DECLARE) for m in msgs[:first])
    prompt = [{"role": m["role"], "content": m["content"]} for m in msgs[:first]
              if not (m["role"] == "system" and m["content"].startswith(TOOL_DECLARE))]
    if not any(m["role"] == "user" for m in prompt):
        raise BadValue("messages", "no user message before the first assistant message")
    reqs = _requests(msgs, first)
    box = toolbox(tools, "available_tools")
    renamed: dict[str, str] = {}
    for r in reqs:
        renamed.update(_resolve_names(r["steps"], names))
        check_gold(box, r["steps"], r["paths"])
    head, later = reqs[0], reqs[1:]
    subset = row_kind(row.get("subset_name"), "subset_name", "")
    targets = parse_target_tools(row.get("target_tools"))
    steps = head["steps"]
    kind = "unservable" if subset == "irrelevant" and not steps else kind_of(steps)
    meta: dict[str, Any] = {
        "source": "toucan",
        "subset": subset,
        "gold_results": head["results"],
        "target_tools": targets,
        "target_tool_matches": {t: [n for n in names if t in n] for t in targets},  # Toucan matches by substring
        "user_turns": 1 + len(later),
        "followups": [{"user": r["user"], "gold": [[{"name": c.name, "arguments": c.arguments} for c in s] for s in r["steps"]],
                       "reference_answer": r["answer"]} for r in later],
    }
    if isinstance(row.get("question"), str):
        meta["question"] = row["question"]
    if declared:
        meta["tool_declare_dropped"] = True
    if renamed:
        meta["renamed_calls"] = renamed
    rid = row_id(row.get("uuid"), "uuid")
    return Task(id=rid or f"toucan-{index}", messages=prompt, tools=tools, gold=steps, kind=kind, meta=meta,
                reference_answer=head["answer"], refusal=subset == "irrelevant" and not steps)
