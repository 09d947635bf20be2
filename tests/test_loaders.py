"""Dataset loaders on fixtures in the published shapes (Toucan-1.5M rows, the paper's verl rows), JSONL, Parquet,
Hugging Face datasets; no network or file access from a schema; every bad row named by file, row and field."""

from __future__ import annotations

import copy
import http.server
import json
import logging
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slca.env import SchemaSimulator, load_tasks, save_tasks, toolworld as tw
from slca.env.loaders import RowError, detect_format, fit_prompts, split_tasks
from slca.env.schema import ToolBox

FIX = Path(__file__).parent / "fixtures" / "env"
TOUCAN_COLUMNS = ["uuid", "subset_name", "messages", "question", "available_tools", "target_tools",
                  "question_quality_assessment", "response_quality_assessment", "metadata"]


def rows(name):
    return [json.loads(x) for x in (FIX / name).read_text().splitlines() if x.strip()]


def write(tmp_path, rows_, name="bad.jsonl"):
    p = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows_), p)
    else:
        p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows_))
    return p


def by_tail(tasks):
    return {t.id[-4:]: t for t in tasks}


def edit(row, col, fn):
    """Apply ``fn`` to the decoded JSON string column ``col`` of a Toucan row (a copy)."""
    row = copy.deepcopy(row)
    v = json.loads(row[col])
    v = fn(v) or v
    row[col] = json.dumps(v)
    return row


# ---------------------------------------------------------------- formats


def test_format_detection_and_explicit_format():
    assert detect_format(rows("toucan_small.jsonl")[0]) == "toucan"
    assert detect_format(rows("verl_small.jsonl")[0]) == "verl"
    assert len(load_tasks(FIX / "verl_small.jsonl", format="verl")) == 4
    with pytest.raises(RowError, match="row 0: field 'messages': missing"):
        load_tasks(FIX / "verl_small.jsonl", format="toucan")
    with pytest.raises(ValueError, match="format must be"):
        load_tasks(FIX / "verl_small.jsonl", format="csv")


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
        assert [(t.reference_answer, t.refusal) for t in back] == [(t.reference_answer, t.refusal) for t in tasks]
        assert tw.make_env(back[0]).__class__.__name__ == "PythonSimulator"


# ---------------------------------------------------------------- Hugging Face datasets


def test_datasets_dataset_and_save_to_disk_folders(tmp_path):
    datasets = pytest.importorskip("datasets")
    ref = load_tasks(FIX / "toucan_small.jsonl")
    ds = datasets.Dataset.from_parquet(str(FIX / "toucan_small.parquet"))
    assert [t.gold for t in load_tasks(ds)] == [t.gold for t in ref]
    ds.save_to_disk(str(tmp_path / "toucan"))
    assert [(t.id, t.gold, t.meta) for t in load_tasks(tmp_path / "toucan")] == [(t.id, t.gold, t.meta) for t in ref]
    # verl rows with nested struct columns, through datasets' own Arrow types
    v = datasets.Dataset.from_list(rows("verl_small.jsonl"))
    assert [t.gold for t in load_tasks(v)] == [t.gold for t in load_tasks(FIX / "verl_small.jsonl")]
    dd = datasets.DatasetDict({"train": ds.select(range(4)), "test": ds.select(range(4, 6))})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"splits \['train', 'test'\]; pass split="):
        load_tasks(tmp_path / "dd")
    assert [t.id[-4:] for t in load_tasks(tmp_path / "dd", split="test")] == ["a005", "a006"]
    assert len(load_tasks(tmp_path / "dd" / "train")) == 4
    with pytest.raises(ValueError, match="not a datasets save_to_disk folder"):
        load_tasks(tmp_path)
    bad = datasets.Dataset.from_list([edit(rows("toucan_small.jsonl")[0], "messages", lambda ms: ms[1].update(content=7))])
    with pytest.raises(RowError, match=r"dataset row 0 \(id .*a001\): field 'messages\[1\].content'"):
        load_tasks(bad)


def test_a_list_of_rows():
    assert [t.gold for t in load_tasks(rows("verl_small.jsonl"))] == [t.gold for t in load_tasks(FIX / "verl_small.jsonl")]


# ---------------------------------------------------------------- no network, no files from a schema


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).hits.append(self.path)
        body = json.dumps({"type": "integer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def schema_server():
    _Recorder.hits = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", _Recorder.hits
    srv.shutdown()
    srv.server_close()


def _with_ref(ref):
    def put(ts):
        ts[1]["function"]["parameters"]["properties"]["numResults"] = {"$ref": ref}
    return edit(rows("toucan_small.jsonl")[0], "available_tools", put)


def test_the_loopback_server_answers(schema_server):
    import urllib.request

    url, hits = schema_server
    assert json.loads(urllib.request.urlopen(url + "/probe.json", timeout=5).read()) == {"type": "integer"}
    assert hits == ["/probe.json"]  # so an empty record below means nothing asked


def test_remote_ref_is_refused_and_never_fetched(tmp_path, schema_server):
    url, hits = schema_server
    with pytest.raises(RowError, match=r"row 0 \(id .*a001\): field 'available_tools\[1\]': .*tool 'exa-search-company_research_exa'.*"
                                       r"\$ref 'http://127.0.0.1:\d+/int.json' points outside the schema"):
        load_tasks(write(tmp_path, [_with_ref(url + "/int.json")]))
    with pytest.raises(ValueError, match="points outside the schema"):  # a simulator built by hand refuses it too
        SchemaSimulator([{"name": "f", "parameters": {"type": "object", "properties": {"x": {"$ref": url + "/x.json"}}}}])
    # a relative ref under a remote $id would resolve to the server: refused as well
    with pytest.raises(ValueError, match="points outside the schema"):
        ToolBox([{"name": "g", "parameters": {"$id": url + "/base/", "type": "object", "properties": {"x": {"$ref": "int.json"}}}}])
    assert hits == []


def test_file_ref_is_refused_and_never_read(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"type": "string", "description": "TOP-SECRET-CONTENT"}))
    with pytest.raises(RowError) as e:
        load_tasks(write(tmp_path, [_with_ref(secret.as_uri())]))
    assert "points outside the schema" in str(e.value) and "TOP-SECRET-CONTENT" not in str(e.value)
    assert e.value.row == 0 and e.value.field == "available_tools[1]"


def test_local_refs_resolve_and_dangling_ones_are_refused(tmp_path):
    (t,) = load_tasks(write(tmp_path, [rows("toucan_small.jsonl")[5]]))  # '#/$defs/Entity' resolves
    assert ToolBox(t.tools).argument_error("memory-bank-create_entities", {"entities": [{"name": 3}]}) is not None
    with pytest.raises(RowError, match=r"field 'available_tools\[1\]': .*\$ref '#/\$defs/Nowhere' does not resolve inside the schema"):
        load_tasks(write(tmp_path, [_with_ref("#/$defs/Nowhere")]))


# ---------------------------------------------------------------- every bad row named: file, row, field


def _toucan(i=0):
    return rows("toucan_small.jsonl")[i]


def _verl(i=0):
    return rows("verl_small.jsonl")[i]


def _set_tool(key, value):
    def put(ts):
        ts[0]["function"][key] = value
    return put


def _deep(n):
    return "[" * n + "]" * n


BAD_ROWS = {
    "tool_calls entry not an object": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2].pop("function_call") and ms[2].update(tool_calls=["exa-search-web_search_exa"])),
        "messages[2].tool_calls[0]", "must be an object, got str"),
    "tool_calls not a list": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2].update(tool_calls={"name": "x"})),
        "messages[2].tool_calls", "must be a list"),
    "messages nested 1000 deep": (
        lambda: {**_toucan(), "messages": _deep(1000)}, "messages", "nested deeper"),
    "arguments nested 150 deep": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2]["function_call"].update(arguments='{"a": ' + _deep(150) + "}")),
        "messages[2].function_call.arguments", "nested deeper than 100 levels"),
    "an integer of 5000 digits in arguments": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2]["function_call"].update(arguments='{"numResults": ' + "9" * 5000 + "}")),
        "messages[2].function_call.arguments", "Exceeds the limit"),
    "answer_facts a string": (
        lambda: {**_verl(), "reward_model": {"ground_truth": json.dumps({"gold_tool_calls": [], "answer_facts": "sunny"})}},
        "reward_model.ground_truth.answer_facts", "a bare string is not split into characters"),
    "answer_facts holding an object": (
        lambda: {**_verl(), "reward_model": {"ground_truth": {"gold_tool_calls": [], "answer_facts": [{"t": 1}]}}},
        "reward_model.ground_truth.answer_facts[0]", "must be a string or a number"),
    "x-stateful the string 'false'": (
        lambda: edit(_toucan(), "available_tools", _set_tool("x-stateful", "false")), "available_tools[0]", "x-stateful must be a bool"),
    "parameters []": (
        lambda: edit(_toucan(), "available_tools", _set_tool("parameters", [])), "available_tools[0]", "parameters must be a JSON Schema object, got list"),
    "tool name with a newline": (
        lambda: edit(_toucan(), "available_tools", _set_tool("name", "web\nsearch")), "available_tools[0]", "contains the character '\\n'"),
    "tool name with <script>": (
        lambda: edit(_toucan(), "available_tools", _set_tool("name", "<script>alert(1)</script>")), "available_tools[0]", "contains the character '<'"),
    "user content a number": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[1].update(content=42)), "messages[1].content", "must be a string, got int"),
    "verl prompt content a list": (
        lambda: {**_verl(), "prompt": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, "prompt[0].content", "must be a string, got list"),
    "unknown role": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[1].update(role="human")), "messages[1].role", "must be one of"),
    "arguments a JSON list": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2]["function_call"].update(arguments="[1, 2]")),
        "messages[2].function_call.arguments", "must be an object, got list"),
    "arguments not JSON": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2]["function_call"].update(arguments="{companyName: x")),
        "messages[2].function_call.arguments", "not valid JSON"),
    "gold call breaking its schema": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2]["function_call"].update(arguments="{}")),
        "messages[2].function_call", "'companyName' is a required property"),
    "gold call to an unknown tool": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2]["function_call"].update(name="exa-search-radar")),
        "messages[2].function_call", "unknown tool 'exa-search-radar'"),
    "a verl gold step of a bare string": (
        lambda: {**_verl(), "reward_model": {"ground_truth": {"gold_tool_calls": [["oops"]]}}},
        "reward_model.ground_truth.gold_tool_calls[0][0]", "unknown tool 'oops'"),
    "a verl gold step that is empty": (
        lambda: {**_verl(), "reward_model": {"ground_truth": {"gold_tool_calls": [[]]}}},
        "reward_model.ground_truth.gold_tool_calls[0]", "an empty step"),
    "a uuid that is an object": (
        lambda: {**_toucan(), "uuid": {"a": 1}}, "uuid", "must be a string or an integer"),
    "extra_info a list": (
        lambda: {**_verl(), "extra_info": [1]}, "extra_info", "must be an object, got list"),
    "kind a number": (
        lambda: {**_verl(), "extra_info": {"kind": 3}}, "extra_info.kind", "must be a string"),
    "NaN in arguments": (
        lambda: edit(_toucan(), "messages", lambda ms: ms[2]["function_call"].update(arguments='{"companyName": "x", "numResults": NaN}')),
        "messages[2].function_call.arguments", "not a JSON value"),
}


_JSON_ONLY = {"a uuid that is an object"}  # a parquet column of strings cannot hold it (as a string it is a valid id)


@pytest.mark.parametrize("case,suffix", [(c, s) for c in BAD_ROWS for s in ("jsonl", "parquet") if not (s == "parquet" and c in _JSON_ONLY)])
def test_bad_row_is_named(tmp_path, case, suffix):
    make, field, problem = BAD_ROWS[case]
    good = _verl(1) if "verl" in case or "answer_facts" in case or "extra_info" in case or "kind" in case else _toucan(1)
    bad = make()
    if suffix == "parquet" and not all(isinstance(v, str) for v in bad.values()):
        bad = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in bad.items()}  # parquet columns as strings
        good = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in good.items()}
    p = write(tmp_path, [good, bad], f"data.{suffix}")
    with pytest.raises(RowError) as e:
        load_tasks(p)
    assert e.value.source == f"data.{suffix}" and e.value.row == 1 and e.value.field == field, str(e.value)
    assert f"data.{suffix} row 1" in str(e.value) and problem in str(e.value)


def test_bad_jsonl_lines(tmp_path):
    with pytest.raises(RowError, match=r"bad.jsonl row 1: line 2 is nested deeper"):
        load_tasks(write(tmp_path, [_verl(), _deep(5000)]))
    with pytest.raises(RowError, match=r"bad.jsonl row 1: line 3 is not valid JSON: Exceeds the limit \(4300 digits\)"):
        load_tasks(write(tmp_path, [_verl(), "", '{"id": ' + "1" * 4400 + "}"]))
    with pytest.raises(RowError, match=r"row 0: a row must be an object, got list"):
        load_tasks(write(tmp_path, [[1, 2]]))


def test_empty_sources_are_refused(tmp_path):
    for name in ("e.jsonl", "e.json"):
        (tmp_path / name).write_text("\n\n" if name.endswith("l") else "[]")
        with pytest.raises(ValueError, match=f"{name}: holds no rows"):
            load_tasks(tmp_path / name)
    pq.write_table(pa.table({"uuid": pa.array([], pa.string())}), tmp_path / "e.parquet")
    with pytest.raises(ValueError, match="e.parquet: holds no rows"):
        load_tasks(tmp_path / "e.parquet")
    with pytest.raises(ValueError, match="rows: holds no rows"):
        load_tasks([])


def test_bad_paths(tmp_path):
    with pytest.raises(ValueError, match="no dataset file"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"\.jsonl, \.json or \.parquet"):
        load_tasks(tmp_path / "x.csv")
    (tmp_path / "y.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="not a readable parquet file"):
        load_tasks(tmp_path / "y.parquet")


def test_errors_skip_logs_each_bad_row_and_keeps_the_rest(tmp_path, caplog):
    good = rows("toucan_small.jsonl")
    bad = BAD_ROWS["x-stateful the string 'false'"][0]()
    p = write(tmp_path, [good[0], bad, "{not json", good[2]])
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        tasks = load_tasks(p, errors="skip")
    assert [t.id[-4:] for t in tasks] == ["a001", "a003"]
    assert "row 1 (id " in caplog.text and "x-stateful must be a bool" in caplog.text and "row 2: line 3" in caplog.text
    assert "skipped 2 of 4 rows" in caplog.text
    with pytest.raises(ValueError, match="none of its 2 rows is valid"):
        load_tasks(write(tmp_path, [bad, "{"], "all_bad.jsonl"), errors="skip")
    with pytest.raises(ValueError, match="errors must be"):
        load_tasks(p, errors="ignore")


def test_long_prompts_are_left_out_with_a_warning(caplog):
    from _tok import make_qwen_tokenizer

    tok = make_qwen_tokenizer()
    tasks = load_tasks(FIX / "toucan_small.jsonl")
    from slca.env.loaders import prompt_lengths

    lengths = prompt_lengths(tasks, tok)
    limit = sorted(lengths)[3]  # the three shortest fit
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        kept = fit_prompts(tasks, tok, limit)
    assert [t.id for t in kept] == [t.id for t, n in zip(tasks, lengths) if n < limit] and len(kept) == 3
    assert f"3 of 6 tasks have a prompt of max_total_tokens={limit} tokens or more (longest {max(lengths)}" in caplog.text
    with pytest.raises(ValueError, match="none is left; raise max_total_tokens"):
        fit_prompts(tasks, tok, min(lengths))


# ---------------------------------------------------------------- held-out split


def test_split_tasks():
    tasks = tw.make_tasks("train", n=50, seed=0)
    train, held = split_tasks(tasks, 0.2, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert sorted(t.id for t in train + held) == sorted(t.id for t in tasks) and not {t.id for t in train} & {t.id for t in held}
    assert [t.id for t in train] == [t.id for t in tasks if t.id not in {h.id for h in held}]  # order kept
    assert [t.id for t in split_tasks(tasks, 0.2, seed=3)[1]] == [t.id for t in held]  # deterministic
    assert [t.id for t in split_tasks(tasks, 0.2, seed=4)[1]] != [t.id for t in held]
    assert len(split_tasks(tasks[:3], 0.01)[1]) == 1 and len(split_tasks(tasks[:3], 0.99)[0]) == 1
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="eval_fraction must be in"):
            split_tasks(tasks, bad)
    with pytest.raises(ValueError, match="need at least 2"):
        split_tasks(tasks[:1], 0.5)
