"""Write slca's toolworld tasks as verl parquet rows in the paper's format, and verl's tool config.

Rows: ``prompt`` (chat list), ``data_source``, ``agent_name``, ``reward_model``
(``style: rule``, ``ground_truth.gold_tool_calls``: a JSON list of steps, each a
list of parallel calls), ``extra_info`` (``index``, ``tools`` as JSON,
``tool_call_format``). Usage::

    python examples/verl/prepare_data.py --out data/toolworld
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import yaml

from slca.env.toolworld import TOOLS, make_tasks


def row(task, split: str) -> dict:
    gold = [[{"name": c.name, "arguments": c.arguments} for c in step] for step in task.gold]
    return {
        "data_source": "slca_toolworld",
        "agent_name": "slca_tool_agent",
        "prompt": task.messages,
        "ability": "tool_use",
        "reward_model": {"style": "rule", "ground_truth": {"gold_tool_calls": json.dumps(gold),
                                                           "answer_facts": list(task.answer_facts)}},
        "extra_info": {"index": task.id, "split": split, "kind": task.kind, "tools": json.dumps(task.tools),
                       "tool_call_format": "hermes"},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/toolworld")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        pd.DataFrame([row(t, split) for t in make_tasks(split, seed=a.seed)]).to_parquet(out / f"{split}.parquet")
    tools = [{"class_name": "slca.integrations.verl_tools.SLCASimulatedTool", "config": {"type": "native", "seed": a.seed},
              "tool_schema": {"type": "function", "function": {k: v for k, v in t["function"].items()
                                                                if k in ("name", "description", "parameters")}}}
             for t in TOOLS]
    dumper = type("NoAliases", (yaml.SafeDumper,), {"ignore_aliases": lambda self, data: True})
    (out / "tool_config.yaml").write_text(yaml.dump({"tools": tools}, Dumper=dumper, sort_keys=False))
    print(f"wrote {out}/train.parquet, test.parquet, tool_config.yaml")


if __name__ == "__main__":
    main()
