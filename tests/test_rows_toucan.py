"""Toucan-1.5M rows as published (slca.env.rows.toucan), read through the loaders: JSONL and Parquet fixtures in the
published schema, tools from every place a row keeps them, target tools, bare names resolved to prefixed tools."""

from __future__ import annotations

import copy
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_loaders import FIX, TOUCAN_COLUMNS, by_tail, edit, rows, write

from slca.env import SchemaSimulator, load_tasks
from slca.env.loaders import RowError, parse_target_tools
from slca.types import ToolCall


# ---------------------------------------------------------------- Toucan as published


@pytest.fixture(params=["toucan_small.jsonl", "toucan_small.parquet"])
def toucan_path(request):
    return FIX / request.param


def test_parquet_fixture_is_the_published_schema():
    schema = pq.read_schema(FIX / "toucan_small.parquet")
    assert schema.names == TOUCAN_COLUMNS and all(t == pa.string() for t in schema.types)
    first = rows("toucan_small.jsonl")[1]
    assert first["target_tools"] == "company_research_exa, competitor_finder_exa, linkedin_search_exa"  # a string, not JSON
    assert json.loads(first["messages"])[0]["content"].startswith("<|im_system|>tool_declare<|im_middle|>[")


def test_toucan_rows(toucan_path):
    t = by_tail(load_tasks(toucan_path))
    assert list(t) == ["a001", "a002", "a003", "a004", "a005", "a006"]
    s = t["a001"]  # Kimi-K2 style: the tool_declare system message is dropped, the template declares the tools
    assert s.messages == [{"role": "user", "content": "What does the fintech startup StellarPay actually do? Give me a short overview."}]
    assert s.meta["tool_declare_dropped"] is True and s.kind == "single"
    assert s.gold == [[ToolCall("exa-search-company_research_exa", {"companyName": "StellarPay", "numResults": 3})]]
    assert s.meta["target_tools"] == ["company_research_exa"]
    assert s.meta["target_tool_matches"] == {"company_research_exa": ["exa-search-company_research_exa"]}
    assert s.reference_answer.startswith("StellarPay is a payments startup") and len(s.meta["gold_results"]) == 1
    assert s.meta["subset"] == "single-turn-original" and s.meta["question"].startswith("What does")

    c = t["a002"]  # two calls with no result between them are one parallel step; the third saw their results
    assert c.kind == "chain"
    assert [[x.name for x in st_] for st_ in c.gold] == [["exa-search-company_research_exa", "exa-search-competitor_finder_exa"],
                                                         ["exa-search-linkedin_search_exa"]]
    assert c.gold[1][0].arguments == {"query": "StellarPay engineering", "searchType": "profiles", "numResults": 5}
    assert c.meta["target_tools"] == ["company_research_exa", "competitor_finder_exa", "linkedin_search_exa"]
    assert all(len(v) == 1 for v in c.meta["target_tool_matches"].values())

    p = t["a003"]  # a reasoning-only assistant message between two calls does not split the step
    assert p.kind == "parallel" and [m["role"] for m in p.messages] == ["system", "user"]
    assert [c_.arguments["location"]["latitude"] for c_ in p.gold[0]] == [39.74, 42.36]
    assert p.reference_answer == "Denver will be warmer (18 C today) than Boston (12 C today)."

    f = t["a004"]  # OSS style: bare names, call_id in function_call, reasoning between sequential calls
    assert f.kind == "chain" and [[x.name for x in s_] for s_ in f.gold] == [["search_flights"], ["book_flight"]]
    assert f.gold[0][0].arguments["passengers"] == [{"type": "adult"}, {"type": "child", "age": 8}]
    assert "call_id" not in f.gold[0][0].arguments

    i = t["a005"]
    assert i.kind == "unservable" and i.gold == [] and i.refusal is True
    assert i.meta["target_tool_matches"] == {"book_appointment": []}  # the irrelevant subset offers other tools
    assert i.reference_answer.startswith("Sorry, I can't book")

    m = t["a006"]  # multi-turn: gold of the first request; the follow-up kept, checked, in meta
    assert m.kind == "single" and m.meta["user_turns"] == 2 and m.meta["subset"] == "multi-turn"
    assert m.gold[0][0].arguments["entities"][0]["name"] == "Ada Lovelace"  # an argument checked through a #/$defs ref
    (fu,) = m.meta["followups"]
    assert fu["user"] == "What do you have stored about her now?"
    assert fu["gold"] == [[{"name": "memory-bank-search_nodes", "arguments": {"query": "Ada Lovelace", "limit": 5}}]]
    assert fu["reference_answer"].startswith("One entity")


def test_jsonl_and_parquet_agree():
    a, b = load_tasks(FIX / "toucan_small.jsonl"), load_tasks(FIX / "toucan_small.parquet")
    assert [(x.id, x.gold, x.messages, x.tools, x.kind, x.meta) for x in a] == [(x.id, x.gold, x.messages, x.tools, x.kind, x.meta) for x in b]


def test_loaded_toucan_tasks_run_in_the_schema_simulator():
    for t in load_tasks(FIX / "toucan_small.jsonl"):
        sim = SchemaSimulator(t.tools, seed=0)
        for step in t.gold:
            for c in step:
                assert sim.call(c.name, c.arguments).ok


@pytest.mark.parametrize("value,want", [
    ("company_research_exa, competitor_finder_exa, linkedin_search_exa", ["company_research_exa", "competitor_finder_exa", "linkedin_search_exa"]),
    ("web_search_exa", ["web_search_exa"]),
    ("Exa Search::web_search_exa, Memory Bank::create_entities", ["web_search_exa", "create_entities"]),
    (" a ,, b ,", ["a", "b"]),
    ("", []),
    (None, []),
    ('["x", "y"]', ["x", "y"]),
])
def test_target_tools_parsing(value, want):
    assert parse_target_tools(value) == want


def test_tools_from_metadata_or_tool_declare_when_available_tools_is_absent(tmp_path):
    src = rows("toucan_small.jsonl")
    ref = load_tasks(FIX / "toucan_small.jsonl")
    no_avail = [{k: v for k, v in r.items() if k != "available_tools"} for r in src]
    got = load_tasks(write(tmp_path, no_avail))  # a001/a002/a006 from tool_declare, the rest from metadata.mcp_servers
    assert [t.gold for t in got[:3]] == [t.gold for t in ref[:3]]
    assert [t.tools for t in got[:3]] == [t.tools for t in ref[:3]]
    only_meta = [{k: v for k, v in r.items() if k != "available_tools"} for r in src[2:3]]
    (w,) = load_tasks(write(tmp_path, only_meta, "m.jsonl"))
    assert [x["function"]["name"] for x in w.tools] == ["national-weather-service-get_forecast", "national-weather-service-get_alerts"]
    assert w.gold == ref[2].gold and w.tools == ref[2].tools
    bare = [{k: v for k, v in src[3].items() if k not in ("available_tools", "metadata")}]
    with pytest.raises(RowError, match=r"row 0 \(id .*a004\): field 'available_tools': missing, and no tools"):
        load_tasks(write(tmp_path, bare, "n.jsonl"))


def test_bare_call_name_resolves_to_the_one_prefixed_tool(tmp_path):
    def unprefix(ms):
        ms[2]["function_call"]["name"] = "company_research_exa"
    (t,) = load_tasks(write(tmp_path, [edit(rows("toucan_small.jsonl")[0], "messages", unprefix)]))
    assert t.gold[0][0].name == "exa-search-company_research_exa"
    assert t.meta["renamed_calls"] == {"company_research_exa": "exa-search-company_research_exa"}


def test_duplicate_tool_names(tmp_path, caplog):
    r = rows("toucan_small.jsonl")[0]
    same = edit(r, "available_tools", lambda ts: ts + [copy.deepcopy(ts[1])])
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        (t,) = load_tasks(write(tmp_path, [same]))
    assert len(t.tools) == 4 and "listed twice with the same schema" in caplog.text

    def clash(ts):
        d = copy.deepcopy(ts[1])
        d["function"]["description"] = "Another server's tool of the same name."
        d["function"]["parameters"]["properties"]["region"] = {"type": "string"}
        ts.append(d)
    with pytest.raises(RowError, match=r"bad.jsonl row 0 \(id .*a001\): field 'available_tools\[4\]': tool 'exa-search-company_research_exa' "
                                       r"is defined twice with different schemas"):
        load_tasks(write(tmp_path, [edit(r, "available_tools", clash)]))
