"""The paper authors' SFT preview rows and slca's SFT reader (env/sft.py): they do not load unchanged.

The rows: ``tests/fixtures/slca_grpo_release/toucan_toolcall_sft.preview.jsonl``, every row of
``data/samples/toucan_toolcall_sft.preview.jsonl`` of ``SLCA-GRPO/SLCA-GRPO`` at commit 68539c5
(Apache-2.0; the fixture's README.md). Their data/README.md: "same schema as the materialised
JSON" that LLaMA-Factory reads (``data/convert_sft_parquet_to_json.py`` writes it from the HF
parquet's ShareGPT ``conversations``, which slca reads: test_env_sft.py).

Finding, pinned here: slca reads neither this shape nor its roles. A row is ``uuid``,
``subset_name``, ``question``, ``target_tools``, ``tools`` (a JSON string) and ``messages`` (a
JSON string) whose roles are ``user`` / ``assistant`` / ``tool_call`` / ``tool_response``; a
``tool_call``'s content is a Python-literal dict (``{'name': ..., 'arguments': '<JSON>'}``,
``str(dict)`` in their converter, not JSON); parallel calls are consecutive ``tool_call``
messages, each answered by one ``tool_response`` in order. The row's keys make
:func:`~slca.env.sft.detect_sft_format` (and the task loader's ``detect_format``) pick
``toucan``, whose roles are system / user / assistant / function / tool, so every row is refused
at ``messages[2].role``. Reading it needs a third SFT format (the two roles, ``ast.literal_eval``
for the call, consecutive calls as one assistant turn); that is a new reader, not a local fix, so
the loader is unchanged. What such a reader must produce is asserted below from the rows
themselves (:func:`demonstration`), so the content is pinned either way.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from slca.env import ToolBox, load_sft_examples, load_tasks
from slca.env.loaders import RowError, detect_format, parse_target_tools
from slca.env.sft import detect_sft_format, sft_example_from_row

SFT = Path(__file__).parent / "fixtures" / "slca_grpo_release" / "toucan_toolcall_sft.preview.jsonl"


def rows() -> list[dict]:
    return [json.loads(x) for x in SFT.read_text(encoding="utf-8").splitlines() if x.strip()]


def demonstration(row: dict) -> tuple[list[list[tuple[str, dict]]], list[str], list[str]]:
    """``(call turns, tool responses, assistant texts)`` of a row, read as their converter writes it:
    consecutive ``tool_call`` messages are one turn of parallel calls; each call is a Python literal
    whose ``arguments`` is a JSON string."""
    turns: list[list[tuple[str, dict]]] = []
    responses, texts = [], []
    prev = None
    for m in json.loads(row["messages"]):
        if m["role"] == "tool_call":
            with pytest.raises(json.JSONDecodeError):
                json.loads(m["content"])  # not JSON: single-quoted keys
            call = ast.literal_eval(m["content"])
            args = json.loads(call["arguments"])
            if prev == "tool_call":
                turns[-1].append((call["name"], args))
            else:
                turns.append([(call["name"], args)])
        elif m["role"] == "tool_response":
            responses.append(m["content"])
        elif m["role"] == "assistant":
            texts.append(m["content"])
        prev = m["role"]
    return turns, responses, texts


# ---------------------------------------------------------------- the rows are refused (finding)


def test_the_fixture_is_the_released_file():
    text = SFT.read_text(encoding="utf-8")
    assert len(text) == 46410 and text.count("\n") == 5
    rs = rows()
    assert [sorted(r) for r in rs] == [["messages", "question", "subset_name", "target_tools", "tools", "uuid"]] * 5
    assert {r["subset_name"] for r in rs} == {"single-turn-diversify"}
    assert [r["uuid"][:8] for r in rs] == ["05f7077a", "c86ca26c", "47cc971d", "b503f410", "a1a233ff"]


def test_slcas_sft_reader_refuses_every_row_at_the_tool_call_role():
    rs = rows()
    assert [detect_sft_format(r) for r in rs] == ["toucan"] * 5
    for i, r in enumerate(rs):
        with pytest.raises(RowError, match="got 'tool_call'") as e:
            sft_example_from_row(r, where=SFT.name, index=i)
        assert e.value.field == "messages[2].role" and e.value.row == i
        assert f"(id {r['uuid']})" in str(e.value)
    with pytest.raises(ValueError, match="none of its 5 rows is valid"):
        load_sft_examples(SFT, errors="skip")
    with pytest.raises(RowError, match="messages\\[2\\]\\.role"):
        load_sft_examples(SFT)


def test_the_task_loader_refuses_them_the_same_way():
    rs = rows()
    assert [detect_format(r) for r in rs] == ["toucan"] * 5  # messages + subset_name / target_tools
    with pytest.raises(ValueError, match="none of its 5 rows is valid"):
        load_tasks(SFT, errors="skip")
    with pytest.raises(RowError) as e:
        load_tasks(SFT)
    assert e.value.field == "messages[2].role"


# ---------------------------------------------------------------- what the rows demonstrate


def test_the_parallel_weather_then_calculator_demonstration():
    r = rows()[0]
    roles = [m["role"] for m in json.loads(r["messages"])]
    assert roles == ["user", "assistant", "tool_call", "tool_call", "tool_response", "tool_response", "assistant",
                     "tool_call", "tool_response", "tool_call", "tool_response", "assistant"]
    turns, responses, texts = demonstration(r)
    assert [len(t) for t in turns] == [2, 1, 1]  # one parallel step of two, then two single steps
    assert turns == [
        [("united-states-weather-get_current_weather", {"location": "42.3601,-71.0589"}),
         ("united-states-weather-get_current_weather", {"location": "41.8781,-87.6298"})],
        [("advanced-calculator-server-add", {"a": 70, "b": 72})],
        [("advanced-calculator-server-div", {"a": 142, "b": 2})],
    ]
    assert "**Station:** KBOS" in responses[0] and "**Temperature:** 69.8°F (21.0°C)" in responses[0]
    assert "**Station:** KMDW" in responses[1] and "**Temperature:** 71.6°F (22.0°C)" in responses[1]
    assert responses[2:] == ["142", "71.0"]
    assert texts[-1].startswith("## Cross-Country Bike Race Weather Summary") and "71.0°F" in texts[-1]
    # target_tools names the add call but not the div call the demonstration also makes
    assert parse_target_tools(r["target_tools"]) == ["get_current_weather", "add"]


def test_the_other_demonstrations_calls_and_results():
    rs = rows()
    got = [demonstration(r) for r in rs[1:]]
    assert [[len(t) for t in turns] for turns, _, _ in got] == [[1, 1], [1, 1], [1], [1]]
    (think, now), t_resp = got[0][0], got[0][1]
    assert think[0][0] == "think-mcp-server-think" and think[0][1]["thought"].startswith("The user is asking for help with stage")
    assert now == [("server-time-get_current_time", {})]
    assert t_resp == ["Great thinking.", '{\n  "currentTime": "2025-08-29 08:07:38"\n}']
    assert got[1][0] == [[("super-shell-get_whitelist", {})],
                         [("super-shell-add_to_whitelist", {"command": "blastn", "securityLevel": "requires_approval",
                                                            "description": "BLAST nucleotide sequence database query program"})]]
    assert json.loads(got[1][1][0])[-1] == {"command": "sudo", "securityLevel": "forbidden",
                                            "description": "Execute a command as another user"}
    assert got[2][0] == [[("flux-imagegen-server-generateImageUrl",
                           {"prompt": "A sleek wind turbine farm glistening under a bright sunrise", "enhance": True})]]
    assert json.loads(got[2][1][0])["seed"] == 925377
    assert got[3][0] == [[("context7-resolve-library-id", {"libraryName": "OpenCV"})]]
    assert "- Context7-compatible library ID: /opencv/opencv" in got[3][1][0]


def test_every_demonstrated_call_fits_its_rows_tool_schemas_and_targets():
    for r in rows():
        tools = json.loads(r["tools"])
        box = ToolBox(tools)  # the tools column passes slca's schema checks as it is
        turns, responses, _ = demonstration(r)
        calls = [c for t in turns for c in t]
        assert len(calls) == len(responses)  # one result per call
        assert all(box.argument_error(name, args) is None for name, args in calls), r["uuid"]
        offered = [t["function"]["name"] for t in tools]
        # every bare target name is the suffix of exactly one offered server-prefixed tool
        assert all(sum(n.endswith("-" + t) for n in offered) == 1 for t in parse_target_tools(r["target_tools"]))
