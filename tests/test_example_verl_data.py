"""examples/verl/prepare_data.py as shipped (no verl needed): its rows load with slca's own loader to the
toolworld tasks they were written from, and carry what verl's reward function is handed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from slca.env import load_tasks
from slca.env.toolworld import TOOLS, make_tasks

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "verl" / "prepare_data.py"


def test_prepared_rows_load_in_slca_as_the_toolworld_tasks(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--n", "60"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    for split in ("train", "test"):
        orig = {t.id: t for t in make_tasks(split, n=60)}
        loaded = load_tasks(tmp_path / f"{split}.parquet")
        assert [t.id for t in loaded] == list(orig)
        for t in loaded:
            o = orig[t.id]
            assert (t.messages, t.tools, t.gold, t.kind, t.answer_facts) == (o.messages, o.tools, o.gold, o.kind, o.answer_facts)
            assert t.reference_answer == o.reference_answer
    row = pq.read_table(tmp_path / "train.parquet").to_pylist()[0]
    task = next(t for t in make_tasks("train", n=60) if t.id == row["extra_info"]["index"])
    info = row["extra_info"]  # all verl hands compute_score besides reward_model.ground_truth
    assert json.loads(info["prompt"]) == task.messages and json.loads(info["tools"]) == task.tools
    assert info["tool_selection"] == [t["function"]["name"] for t in task.tools]
    assert row["agent_name"] == "slca_tool_agent" and info["tool_call_format"] == "hermes"
    cfg = yaml.safe_load((tmp_path / "tool_config.yaml").read_text())
    assert [t["tool_schema"]["function"]["name"] for t in cfg["tools"]] == [t["function"]["name"] for t in TOOLS]
