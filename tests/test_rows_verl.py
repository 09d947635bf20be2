"""The paper's verl-native rows (slca.env.rows.verl), from JSONL and Parquet."""

from __future__ import annotations


import pytest
from test_loaders import FIX, rows, write

from slca.env import load_tasks
from slca.types import ToolCall


# ---------------------------------------------------------------- the paper's verl rows, slca rows


@pytest.fixture(params=["jsonl", "parquet"])
def verl_path(request, tmp_path):
    return FIX / "verl_small.jsonl" if request.param == "jsonl" else write(tmp_path, rows("verl_small.jsonl"), "v.parquet")


def test_verl_rows(verl_path):
    tasks = load_tasks(verl_path)
    assert [t.id for t in tasks] == ["0", "1", "2", "3"]
    assert [t.kind for t in tasks] == ["single", "parallel", "chain", "no_tool"]
    assert tasks[0].messages[1]["content"] == "3-day forecast for Rome (41.9, 12.5)?" and tasks[0].answer_facts == ["18", "sunny"]
    assert tasks[2].gold[1] == [ToolCall("book_flight", {"flight_id": "TP1203", "contact": {"name": "Kari Nord", "email": "kari@example.com"}})]
    assert tasks[1].meta["data_source"] == "toucan_slca"
