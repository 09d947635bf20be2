"""SFT rows -> TRL's conversational SFT rows: ``{"messages": [...], "tools": [...]}``.

What TRL's ``SFTTrainer`` reads for tool calling: assistant messages carry
``tool_calls`` in the OpenAI shape (``{"id", "type": "function", "function":
{"name", "arguments"}}``, ``arguments`` a JSON *object*, as transformers' chat
templates render it: Qwen2.5's writes ``arguments | tojson``), results are
``{"role": "tool", "content", "name", "tool_call_id"}`` messages, and ``tools``
are OpenAI tool schemas that the chat template declares. The model's own chat
template then writes the calls in its own markup, so the SFT stage teaches the
format the RL stage's tool loop parses (TRL's response parser for that template).

Row formats:

* ``sharegpt`` -- the paper's ``sft_split`` / ``sft_full`` rows
  (``AnonymousRepository/toucan-toolcall-slca``): ``conversations``, a list of
  ``{"from", "value"}`` with ``from`` in ``system`` / ``human`` / ``gpt``. The
  system turn declares the tools inside ``<tools>...</tools>`` (hermes: one JSON
  object per line, or a JSON list); a ``tools`` column, when present, is used
  instead, and a ``system`` column stands for a system turn. A ``gpt`` turn
  interleaves ``<think>...</think>`` blocks and ``<tool_call>[...]</tool_call>``
  blocks (a JSON list of ``{"name", "arguments"}``; a single object is read as a
  one-call list), then the user-facing text; a ``human`` turn that answers
  calls holds one ``<tool_response>...</tool_response>`` block per result.
* ``toucan`` -- Toucan-1.5M rows (the ``messages`` column; see
  :mod:`slca.env.loaders`): a call is an assistant message with
  ``function_call`` (or ``tool_calls``), consecutive calls with no result
  between them are one parallel turn, results are ``function`` messages.
* ``llamafactory`` -- LLaMA-Factory's ``sharegpt`` formatting with role tags
  ``role`` / ``content`` and the tool roles ``tool_call`` (its
  ``function_tag``) and ``tool_response`` (its ``observation_tag``): the shape
  the paper authors' ``data/convert_sft_parquet_to_json.py`` writes and
  ``data/dataset_info.json`` registers (``SLCA-GRPO/SLCA-GRPO``; their
  ``data/samples/toucan_toolcall_sft.preview.jsonl``). ``messages`` (a list, or
  a JSON string of one) of ``system`` (first only) / ``user`` / ``assistant``
  / ``tool_call`` / ``tool_response`` messages and ``tools`` (OpenAI schemas,
  a JSON string). A ``tool_call``'s content is one call ``{name, arguments}``
  (or a list of calls) written as JSON or as a Python literal (their converter
  writes ``str(dict)``, single-quoted; read with :func:`ast.literal_eval`, never
  ``eval``), its ``arguments`` an object or a JSON string of one. Consecutive
  ``tool_call`` messages are one assistant turn of parallel calls; an
  ``assistant`` message right before them is that turn's content, as a ShareGPT
  ``gpt`` turn holds its text and its ``<tool_call>`` block together (the
  preview writes the text as its own message before the calls; the published
  converter drops it), otherwise the turn's content is empty. ``<think>``
  blocks in an assistant text are placed as ``reasoning`` says. Each ``tool_response``
  answers the next unanswered call of the latest call turn, in order; a
  ``tool_response`` with no such call is refused. Other columns (``uuid``,
  ``subset_name``, ``question``, ``target_tools``) are not read.

Conversion rules (one place; docs/environment.md, "SFT rows for TRL"):

* The ``<tools>`` block (the last non-empty one, with a ``# Tools`` heading
  line right above it) is cut out of the system text (the chat template
  declares the tools); the rest of the system text is kept as it is.
* ``reasoning``: ``"content"`` (default) keeps each ``<think>`` block at the
  start of the assistant's content (every chat template renders it, and the
  model learns to think as the data does); ``"field"`` moves it to
  ``reasoning_content`` (for templates that render that field, e.g. Qwen3's);
  ``"drop"`` leaves it out.
* The text of a ``gpt`` turn outside its blocks is the message's content
  (the template writes it before the calls).
* A result gets the ``name`` and ``tool_call_id`` of the call it answers when
  the ``human`` turn holds as many ``<tool_response>`` blocks as the turn before
  made calls (Toucan: by name, in order); otherwise the tool messages carry
  neither. Text of a ``human`` turn outside its ``<tool_response>`` blocks becomes a
  user message after them.
* Calls are not checked against the tool schemas: a trajectory may hold a
  failed call and the answer to it, which is data.

A row that cannot be converted raises :class:`~slca.env.loaders.RowError`
naming the row and the field (``conversations[3].value``); ``errors="skip"``
logs and leaves it out, as :func:`~slca.env.loaders.load_tasks` does.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from slca.env.loaders import checked_row_id, read_rows
from slca.env.rows.fields import BadValue, RowError, as_dict, as_list, decoded, json_value, row_call, row_messages, row_tools
from slca.env.rows.toucan import TOOL_DECLARE, toucan_tools

__all__ = ["SFT_FORMATS", "REASONING", "detect_sft_format", "sft_example_from_row", "load_sft_examples", "sft_dataset"]

SFT_FORMATS = ("sharegpt", "toucan", "llamafactory")
REASONING = ("content", "field", "drop")
_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
_BLOCK = re.compile(r"<think>(.*?)</think>|<tool_call>(.*?)</tool_call>", re.S)
_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_LF_ROLES = ("system", "user", "assistant", "tool_call", "tool_response")
_TOOLS_BLOCK = re.compile(r"(?:^#+[ \t]*Tools[ \t]*\n\s*)?<tools>(.*?)</tools>", re.S | re.M | re.I)

Message = dict[str, Any]


def _openai_call(name: str, arguments: dict[str, Any], cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def _with_reasoning(msg: Message, thoughts: list[str], reasoning: str) -> Message:
    """Place the turn's reasoning as ``reasoning`` says (see the module docstring)."""
    if thoughts and reasoning == "content":
        think = "".join(f"<think>\n{t}\n</think>\n\n" for t in thoughts)
        msg["content"] = (think + msg["content"]).rstrip()
    elif thoughts and reasoning == "field":
        msg["reasoning_content"] = "\n\n".join(thoughts)
    return msg


# ---------------------------------------------------------------- ShareGPT (the paper's sft rows)


def _unclosed(text: str, tag: str, field: str) -> None:
    if text.count(f"<{tag}>") != text.count(f"</{tag}>"):
        raise BadValue(field, f"<{tag}> and </{tag}> do not pair up ({text.count(f'<{tag}>')} opened, {text.count(f'</{tag}>')} closed)")


def _gpt_message(text: str, field: str, turn: int, reasoning: str) -> Message:
    """A ``gpt`` turn -> an assistant message (content, ``tool_calls``, reasoning)."""
    _unclosed(text, "think", field)
    _unclosed(text, "tool_call", field)
    thoughts, calls, rest, pos = [], [], [], 0
    for m in _BLOCK.finditer(text):
        rest.append(text[pos:m.start()])
        pos = m.end()
        if m.group(1) is not None:
            thoughts.append(m.group(1).strip("\n"))
            continue
        f = f"{field}.tool_call[{len(calls)}]"
        try:
            body = json_value(m.group(2).strip())
        except ValueError as e:
            raise BadValue(f, str(e)) from None
        for k, c in enumerate(body if isinstance(body, list) else [body]):
            call = row_call(c, f"{f}[{k}]")
            calls.append(_openai_call(call.name, call.arguments, f"call_{turn}_{len(calls)}"))
    rest.append(text[pos:])
    msg: Message = {"role": "assistant", "content": "".join(rest).strip()}
    if calls:
        msg["tool_calls"] = calls
    return _with_reasoning(msg, thoughts, reasoning)


def _human_messages(text: str, field: str, pending: list[dict[str, Any]]) -> list[Message]:
    """A ``human`` turn -> tool messages (one per ``<tool_response>`` block), then a user message for other text."""
    _unclosed(text, "tool_response", field)
    bodies = [m.group(1).strip("\n") for m in _RESPONSE.finditer(text)]
    if not bodies:
        return [{"role": "user", "content": text}]
    paired = len(bodies) == len(pending)
    out: list[Message] = []
    for i, body in enumerate(bodies):
        msg: Message = {"role": "tool", "content": body}
        if paired:
            msg.update(name=pending[i]["function"]["name"], tool_call_id=pending[i]["id"])
        out.append(msg)
    rest = _RESPONSE.sub("", text).strip()
    if rest:
        out.append({"role": "user", "content": rest})
    return out


def _declared_tools(system: str, field: str) -> tuple[str, list[dict[str, Any]] | None]:
    """``(system text without the <tools> block, the tools it declares or None)``."""
    # the last non-empty block: hermes prose mentions "<tools></tools> XML tags" before the real one
    m = next((b for b in reversed(list(_TOOLS_BLOCK.finditer(system))) if b.group(1).strip()), None)
    if m is None:
        return system, None
    body = m.group(1).strip()
    try:
        tools = json_value(body) if body.startswith("[") else [json_value(line) for line in body.splitlines() if line.strip()]
    except ValueError as e:
        raise BadValue(f"{field}.<tools>", str(e)) from None
    return (system[:m.start()] + system[m.end():]).strip(), row_tools(tools, f"{field}.<tools>")


def _turns(row: dict[str, Any]) -> list[dict[str, Any]]:
    if row.get("conversations") is None:
        raise BadValue("conversations", f"missing (the row has {sorted(row)})")
    turns = as_list(decoded(row["conversations"], "conversations"), "conversations")
    for i, t in enumerate(turns):
        t = as_dict(t, f"conversations[{i}]")
        if t.get("from") not in _ROLES:
            raise BadValue(f"conversations[{i}].from", f"must be one of {list(_ROLES)}, got {t.get('from')!r:.40}")
        if not isinstance(t.get("value"), str):
            raise BadValue(f"conversations[{i}].value", f"must be a string, got {type(t.get('value')).__name__}")
    return turns


def _from_sharegpt(row: dict[str, Any], reasoning: str) -> dict[str, Any]:
    turns = _turns(row)
    system = row.get("system")
    if system is not None and not isinstance(system, str):
        raise BadValue("system", f"must be a string, got {type(system).__name__}")
    sys_field = "system"
    if turns and turns[0]["from"] == "system":
        system, sys_field, turns = turns[0]["value"], "conversations[0].value", turns[1:]
    offset = 1 if sys_field != "system" else 0
    tools = row_tools(row["tools"], "tools") if row.get("tools") is not None else None
    messages: list[Message] = []
    if system is not None:
        text, declared = _declared_tools(system, sys_field)
        tools = tools if tools is not None else declared
        if text:
            messages.append({"role": "system", "content": text})
    pending: list[dict[str, Any]] = []
    for j, t in enumerate(turns):
        i = j + offset
        want = "human" if j % 2 == 0 else "gpt"
        if t["from"] != want:
            raise BadValue(f"conversations[{i}].from", f"expected {want!r} (human and gpt turns alternate after the system turn), got {t['from']!r}")
        if want == "human":
            messages += _human_messages(t["value"], f"conversations[{i}].value", pending)
        else:
            messages.append(_gpt_message(t["value"], f"conversations[{i}].value", i, reasoning))
            pending = messages[-1].get("tool_calls", [])
    if not turns or turns[-1]["from"] != "gpt":
        raise BadValue("conversations", "must end with a gpt turn (there is nothing to learn after the last human turn)")
    return {"messages": messages, "tools": tools or []}


# ---------------------------------------------------------------- Toucan


def _toucan_calls(m: Message, f: str) -> list[tuple[Any, str]]:
    calls = []
    if "function_call" in m:
        calls.append((row_call(m["function_call"], f"{f}.function_call"), f"{f}.function_call"))
    for k, tc in enumerate(as_list(m.get("tool_calls") or [], f"{f}.tool_calls")):
        tf = f"{f}.tool_calls[{k}]"
        tc = as_dict(tc, tf)
        if "function" in tc:
            tf, tc = f"{tf}.function", tc["function"]
        calls.append((row_call(tc, tf), tf))
    return calls


def _toucan_result(m: Message, pending: list[dict[str, Any]]) -> Message:
    """A function / tool result, paired with the first pending call of its name (else the first pending call)."""
    content = m.get("content")
    msg: Message = {"role": "tool", "content": content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)}
    match = next((c for c in pending if c["function"]["name"] == m.get("name")), pending[0] if pending else None)
    if match is not None:
        pending.remove(match)
        msg.update(name=match["function"]["name"], tool_call_id=match["id"])
    return msg


def _from_toucan(row: dict[str, Any], reasoning: str) -> dict[str, Any]:
    if row.get("messages") is None:
        raise BadValue("messages", f"missing (the row has {sorted(row)})")
    msgs = row_messages(row["messages"], "messages")
    tools = toucan_tools(row, msgs)
    out: list[Message] = []
    pending: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        f = f"messages[{i}]"
        if m["role"] == "system" and m["content"].startswith(TOOL_DECLARE):
            continue  # the chat template declares the tools
        if m["role"] in ("system", "user"):
            out.append({"role": m["role"], "content": m["content"]})
        elif m["role"] in ("function", "tool"):
            out.append(_toucan_result(m, pending))
        else:
            calls = [_openai_call(c.name, c.arguments, f"call_{i}_{k}") for k, (c, _) in enumerate(_toucan_calls(m, f))]
            thoughts = [m["reasoning_content"].strip("\n")] if m.get("reasoning_content") else []
            msg = _with_reasoning({"role": "assistant", "content": (m.get("content") or "").strip()}, thoughts, reasoning)
            prev = out[-1] if out else None
            if calls and prev is not None and prev.get("tool_calls") and not msg["content"] and not msg.get("reasoning_content"):
                prev["tool_calls"] += calls  # a parallel call: no result came between them
            else:
                if calls:
                    msg["tool_calls"] = calls
                out.append(msg)
            pending += calls
    if not out or out[-1]["role"] != "assistant":
        raise BadValue("messages", "must end with an assistant message (there is nothing to learn after the last one)")
    return {"messages": out, "tools": tools}


# ---------------------------------------------------------------- LLaMA-Factory (the authors' materialised SFT JSON)


def _lf_messages(row: dict[str, Any]) -> list[Message]:
    if row.get("messages") is None:
        raise BadValue("messages", f"missing (the row has {sorted(row)})")
    msgs = as_list(decoded(row["messages"], "messages"), "messages")
    for i, m in enumerate(msgs):
        f = f"messages[{i}]"
        m = as_dict(m, f)
        if m.get("role") not in _LF_ROLES:
            raise BadValue(f"{f}.role", f"must be one of {list(_LF_ROLES)}, got {m.get('role')!r:.40}")
        if m["role"] == "system" and i:
            raise BadValue(f"{f}.role", "a system message must come first")
        if not isinstance(m.get("content"), str):
            raise BadValue(f"{f}.content", f"must be a string, got {type(m.get('content')).__name__}")
    return msgs


def _lf_calls(text: str, field: str) -> list[Any]:
    """A ``tool_call`` message's content: a call (or a list of calls) as JSON or as a Python literal."""
    try:
        value = json_value(text)
    except ValueError:
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
            why = re.sub(r" at 0x[0-9a-fA-F]+", "", f"{type(e).__name__}: {e}".splitlines()[0])[:160]
            raise BadValue(field, "a tool_call's content must be a call {'name': ..., 'arguments': ...} written as JSON or as a "
                              f"Python literal; it is neither ({why})") from None
    return [row_call(c, f"{field}[{k}]") for k, c in enumerate(value)] if isinstance(value, list) else [row_call(value, field)]


def _lf_text(text: str, field: str, reasoning: str) -> Message:
    """An assistant message's text: ``<think>`` blocks placed as ``reasoning`` says, the rest the content."""
    _unclosed(text, "think", field)
    thoughts = [t.strip("\n") for t in _THINK.findall(text)]
    return _with_reasoning({"role": "assistant", "content": _THINK.sub("", text).strip()}, thoughts, reasoning)


def _from_llamafactory(row: dict[str, Any], reasoning: str) -> dict[str, Any]:
    msgs = _lf_messages(row)
    tools = row_tools(row["tools"], "tools") if row.get("tools") is not None else []
    out: list[Message] = []
    pending: list[dict[str, Any]] = []  # the latest call turn's calls not answered yet
    prev = None
    for i, m in enumerate(msgs):
        f = f"messages[{i}]"
        role, text = m["role"], m["content"]
        if role == "tool_call":
            calls = [_openai_call(c.name, c.arguments, f"call_{i}_{k}") for k, c in enumerate(_lf_calls(text, f"{f}.content"))]
            if prev == "tool_call":
                out[-1]["tool_calls"] += calls  # a parallel call: consecutive tool_call messages
                pending += calls
            else:
                if prev == "assistant":  # the text of the turn that makes the calls
                    out[-1]["tool_calls"] = calls
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": calls})
                pending = list(calls)
        elif role == "tool_response":
            if not pending:
                raise BadValue(f"{f}.role", "a tool_response with no call to answer: each tool_response answers the next "
                                        "unanswered call of the tool_call messages before it, in order, and none is left")
            call = pending.pop(0)
            out.append({"role": "tool", "content": text, "name": call["function"]["name"], "tool_call_id": call["id"]})
        elif role == "assistant":
            out.append(_lf_text(text, f"{f}.content", reasoning))
        else:
            if role == "user":
                pending = []
            out.append({"role": role, "content": text})
        prev = role
    if not out or out[-1]["role"] != "assistant":
        raise BadValue("messages", "must end with an assistant or tool_call message (there is nothing to learn after the last one)")
    return {"messages": out, "tools": tools}


# ---------------------------------------------------------------- rows, sources, a datasets.Dataset


def _has_lf_roles(messages: Any) -> bool:
    """Whether a ``messages`` value (a list or JSON text of one) holds a ``tool_call`` / ``tool_response`` message."""
    if isinstance(messages, str):
        if "tool_call" not in messages and "tool_response" not in messages:
            return False  # a Toucan row's messages are not decoded twice
        try:
            messages = json_value(messages)
        except ValueError:
            return False  # the reader names the problem
    return isinstance(messages, list) and any(isinstance(m, dict) and m.get("role") in ("tool_call", "tool_response")
                                              for m in messages)


def detect_sft_format(row: dict[str, Any]) -> str:
    """Which of :data:`SFT_FORMATS` a row is: from its keys, and for ``messages`` rows from the roles (a
    ``tool_call`` or ``tool_response`` message: ``llamafactory``; otherwise ``toucan``)."""
    if "conversations" in row:
        return "sharegpt"
    if "messages" in row:
        return "llamafactory" if _has_lf_roles(row["messages"]) else "toucan"
    raise ValueError(f"cannot tell the SFT row's format from its keys {sorted(row)}: a ShareGPT row has 'conversations', "
                     "a Toucan or LLaMA-Factory row 'messages'")


_READERS = {"sharegpt": _from_sharegpt, "toucan": _from_toucan, "llamafactory": _from_llamafactory}


def sft_example_from_row(row: Any, format: str = "auto", *, reasoning: str = "content", where: str = "input",
                         index: int = 0) -> dict[str, Any]:
    """One SFT row as TRL's ``{"messages", "tools"}`` (see the module docstring).

    Raises:
        RowError: naming ``where``, row ``index``, the field and the problem.
    """
    if format != "auto" and format not in SFT_FORMATS:
        raise ValueError(f"format must be 'auto' or one of {SFT_FORMATS}, got {format!r}")
    if reasoning not in REASONING:
        raise ValueError(f"reasoning must be one of {REASONING}, got {reasoning!r}")
    rid = checked_row_id(row, where, index)
    try:
        fmt = detect_sft_format(row) if format == "auto" else format
        return _READERS[fmt](row, reasoning)
    except BadValue as e:
        raise RowError(where, index, e.field, e.problem, rid) from None
    except ValueError as e:  # detect_sft_format
        raise RowError(where, index, "", str(e), rid) from None


def load_sft_examples(source: Any, format: str = "auto", *, reasoning: str = "content", split: str | None = None,
                      errors: str = "raise") -> list[dict[str, Any]]:
    """Every row of ``source`` (what :func:`~slca.env.loaders.load_tasks` reads) as TRL SFT rows.

    ``errors``: ``"raise"`` or ``"skip"`` (each bad row logged on ``slca.env``, as for ``load_tasks``).
    """
    if format != "auto" and format not in SFT_FORMATS:
        raise ValueError(f"format must be 'auto' or one of {SFT_FORMATS}, got {format!r}")
    if reasoning not in REASONING:
        raise ValueError(f"reasoning must be one of {REASONING}, got {reasoning!r}")
    return read_rows(source, lambda row, where, i: sft_example_from_row(row, format, reasoning=reasoning, where=where, index=i),
                     split=split, errors=errors)


def sft_dataset(examples: list[dict[str, Any]]) -> Any:
    """A ``datasets.Dataset`` of SFT rows for TRL's ``SFTTrainer``, each message exactly as built.

    Arrow gives every row one schema: stored as plain structs, a call's
    ``arguments`` would gain every other call's keys as nulls (and the template
    would write them). So each message is a ``Json()`` value (datasets >= 4.7)
    and ``tools`` a JSON string (which ``SFTTrainer`` decodes itself).
    """
    try:
        from datasets import Dataset, Features, Json, List, Value
    except ImportError:
        raise ValueError("sft_dataset needs datasets >= 4.7 (its Json feature keeps each message's keys as they are): "
                         "pip install -U 'datasets>=4.7'") from None
    rows = [{"messages": e["messages"], "tools": json.dumps(e["tools"], ensure_ascii=False)} for e in examples]
    return Dataset.from_list(rows, features=Features({"messages": List(Json()), "tools": Value("string")}))
