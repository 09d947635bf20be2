"""Dataset loaders on fixtures of both shapes (Toucan raw rows, the paper's verl rows), JSONL and Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slca.env import load_tasks, save_tasks, toolworld as tw
from slca.env.loaders import detect_format
from slca.types import ToolCall

FIX = Path(__file__).parent / "fixtures" / "env"


def rows(name):
    return [json.loads(x) for x in (FIX / name).read_text().splitlines() if x.strip()]


def as_parquet(tmp_path, name):
    p = tmp_path / name.replace(".jsonl", ".parquet")
    pq.write_table(pa.Table.from_pylist(rows(name)), p)
    return p


@pytest.fixture(params=["jsonl", "parquet"])
def toucan_path(request, tmp_path):
    return FIX / "toucan_small.jsonl" if request.param == "jsonl" else as_parquet(tmp_path, "toucan_small.jsonl")


@pytest.fixture(params=["jsonl", "parquet"])
def verl_path(request, tmp_path):
    return FIX / "verl_small.jsonl" if request.param == "jsonl" else as_parquet(tmp_path, "verl_small.jsonl")


def test_toucan_rows(toucan_path):
    tasks = {t.id: t for t in load_tasks(toucan_path)}
    assert list(tasks) == ["t-single", "t-parallel", "t-chain", "t-irrelevant"]
    s = tasks["t-single"]
    assert [m["role"] for m in s.messages] == ["system", "user"]
    assert s.gold == [[ToolCall("weather-get_forecast", {"city": "Oslo", "days": 3})]] and s.kind == "single"
    assert [t["function"]["name"] for t in s.tools] == ["weather-get_forecast", "finance-get_quote"]
    assert s.meta["reference_answer"] == "Oslo: highs of 4, 6 and 5 C." and s.meta["target_tools"] == ["weather-get_forecast"]
    p = tasks["t-parallel"]
    assert p.kind == "parallel" and [[c.arguments["ticker"] for c in st] for st in p.gold] == [["ACME", "INIT"]]
    c = tasks["t-chain"]  # only the first request's calls; the follow-up user turn is not part of the prompt
    assert c.kind == "chain" and [[x.name for x in st] for st in c.gold] == [["finance-get_quote"], ["finance-convert"]]
    assert c.gold[1][0].arguments == {"amount": 12.5, "to": "EUR"} and len(c.messages) == 2
    i = tasks["t-irrelevant"]
    assert i.kind == "unservable" and i.gold == [] and i.meta["refusal"] is True


def test_verl_rows(verl_path):
    tasks = load_tasks(verl_path)
    assert [t.id for t in tasks] == ["0", "1", "2", "3"]
    assert [t.kind for t in tasks] == ["single", "parallel", "chain", "no_tool"]
    assert tasks[0].messages[0]["role"] == "system" and tasks[0].messages[1]["content"] == "Forecast for Rome?"
    assert tasks[2].gold[1] == [ToolCall("finance-convert", {"amount": 12.5, "to": "GBP"})]  # string arguments decoded
    assert tasks[1].meta["data_source"] == "toucan_slca"


def test_format_detection_and_explicit_format():
    assert detect_format(rows("toucan_small.jsonl")[0]) == "toucan"
    assert detect_format(rows("verl_small.jsonl")[0]) == "verl"
    assert len(load_tasks(FIX / "verl_small.jsonl", format="verl")) == 4
    with pytest.raises(ValueError, match="row 0: missing field 'messages'"):
        load_tasks(FIX / "verl_small.jsonl", format="toucan")
    with pytest.raises(ValueError, match="format must be"):
        load_tasks(FIX / "verl_small.jsonl", format="csv")


def _write(tmp_path, rows_, name="bad.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    return p


def test_missing_field_names_the_row(tmp_path):
    rs = rows("verl_small.jsonl")
    del rs[2]["tools"]
    with pytest.raises(ValueError, match=r"bad.jsonl row 2: missing field 'tools'"):
        load_tasks(_write(tmp_path, rs))
    rs = rows("verl_small.jsonl")
    rs[1]["reward_model"] = {"style": "rule", "ground_truth": json.dumps({"answer": 1})}
    with pytest.raises(ValueError, match=r"row 1 reward_model.ground_truth: missing field 'gold_tool_calls'"):
        load_tasks(_write(tmp_path, rs))
    rs = rows("toucan_small.jsonl")
    rs[3]["messages"] = "[not json"
    with pytest.raises(ValueError, match=r"row 3 \(id t-irrelevant\): field 'messages' is not valid JSON"):
        load_tasks(_write(tmp_path, rs))


def test_gold_violating_its_schema_names_the_row(tmp_path):
    rs = rows("verl_small.jsonl")
    rs[0]["reward_model"]["ground_truth"] = json.dumps({"gold_tool_calls": [[{"name": "weather-get_forecast", "arguments": {"days": 2}}]]})
    with pytest.raises(ValueError, match=r"row 0.*gold step 0 call 0 violates its schema.*'city' is a required property"):
        load_tasks(_write(tmp_path, rs))
    rs = rows("toucan_small.jsonl")
    msgs = json.loads(rs[0]["messages"])
    msgs[2]["function_call"]["name"] = "weather-get_radar"
    rs[0]["messages"] = json.dumps(msgs)
    with pytest.raises(ValueError, match=r"row 0 \(id t-single\).*unknown tool 'weather-get_radar'"):
        load_tasks(_write(tmp_path, rs))


def test_invalid_tool_schema_names_row_and_tool(tmp_path):
    rs = rows("toucan_small.jsonl")
    tools = json.loads(rs[1]["available_tools"])
    tools[0]["function"]["parameters"]["properties"]["ticker"]["type"] = "text"
    rs[1]["available_tools"] = json.dumps(tools)
    with pytest.raises(ValueError, match=r"row 1 \(id t-parallel\): tool 'finance-get_quote': invalid parameters schema"):
        load_tasks(_write(tmp_path, rs))


def test_bad_paths(tmp_path):
    with pytest.raises(ValueError, match="no dataset file"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"\.jsonl, \.json or \.parquet"):
        load_tasks(tmp_path / "x.csv")


@pytest.mark.parametrize("fmt,suffix", [("slca", "jsonl"), ("slca", "parquet"), ("verl", "jsonl"), ("verl", "parquet")])
def test_save_and_reload_toolworld(tmp_path, fmt, suffix):
    tasks = tw.make_tasks("test", n=40, seed=1)
    back = load_tasks(save_tasks(tasks, tmp_path / f"tw.{suffix}", format=fmt))
    assert [t.gold for t in back] == [t.gold for t in tasks]
    assert [t.messages for t in back] == [t.messages for t in tasks]
    assert [t.kind for t in back] == [t.kind for t in tasks]
    assert [t.answer_facts for t in back] == [t.answer_facts for t in tasks]
    if fmt == "slca":
        assert [t.id for t in back] == [t.id for t in tasks] and back[0].meta == tasks[0].meta
        # the reloaded tasks still run in the toolworld env
        assert tw.make_env(back[0]).__class__.__name__ == "PythonSimulator"
