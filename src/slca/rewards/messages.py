"""Turns from an OpenAI-style message list, for scoring conversations produced elsewhere (TRL, verl, logs).

Assistant messages become :class:`Turn`s (calls from ``tool_calls``); the
``tool`` messages that follow an assistant message become its results, in
order. A tool message whose content is ``{"error": ...}`` (what
:meth:`ToolResult.to_text` writes for a failed call) is a failed result.
"""

from __future__ import annotations

import json
from typing import Any

from slca.types import ParsedTurn, ParseError, ToolCall, ToolResult, Turn

__all__ = ["tool_result", "turns_from_messages"]


def tool_result(content: Any) -> ToolResult:
    """A tool message's content as a :class:`ToolResult`, the inverse of :meth:`ToolResult.to_text`:
    ``{"error": ...}`` (that key alone) is a failed call; other JSON is decoded; text that is
    not JSON stays text."""
    if isinstance(content, str):
        try:
            value = json.loads(content)
        except json.JSONDecodeError:
            return ToolResult(ok=True, content=content)
    else:
        value = content
    if isinstance(value, dict) and set(value) == {"error"}:
        return ToolResult(ok=False, error=str(value["error"]))
    return ToolResult(ok=True, content=value)


def turns_from_messages(messages: list[dict[str, Any]]) -> tuple[list[Turn], str]:
    """``(turns, final_text)`` of a conversation's assistant part.

    Args:
        messages: OpenAI chat messages; those before the first assistant message
            (system, user) are skipped. Call ``arguments`` may be objects or JSON strings;
            arguments that are not a JSON object become a ``ParseError`` of the turn.

    Returns:
        One Turn per assistant message, and the content of the last assistant
        message if it made no call ("" otherwise).
    """
    turns: list[Turn] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"messages[{i}] must be a chat message with a 'role'")
        role = m["role"]
        if role == "assistant":
            calls, errors = [], []
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function", tc)
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError as e:
                        errors.append(ParseError("invalid_json", f"arguments are not valid JSON: {e}", fn.get("arguments", "")))
                        continue
                if not isinstance(args, dict) or not isinstance(fn.get("name"), str):
                    errors.append(ParseError("arguments_not_object", "a call needs a name and an object of arguments", json.dumps(fn, default=str)))
                    continue
                calls.append(ToolCall(fn["name"], args, tc.get("id")))
            content = m.get("content") or ""
            turns.append(Turn(text=content, parsed=ParsedTurn(content=content, calls=calls, errors=errors)))
        elif role == "tool":
            if not turns:
                raise ValueError(f"messages[{i}] is a tool message before any assistant message")
            turns[-1].results.append(tool_result(m.get("content")))
    final = turns[-1].parsed.content if turns and not turns[-1].parsed.is_tool_turn else ""
    return turns, final
