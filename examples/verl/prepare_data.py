"""Write slca's toolworld tasks as verl parquet rows, and verl's tool config.

One row layout, read by both sides:

* verl: ``prompt`` (chat list), ``data_source``, ``agent_name``
  (``slca_tool_agent``), ``reward_model`` (``style: rule``, ``ground_truth``:
  JSON of ``gold_tool_calls`` -- a list of steps, each a list of parallel
  ``{name, arguments}`` -- and ``answer_facts``), ``extra_info``: what verl hands
  the reward function besides the ground truth, so the whole task is there:
  ``index``, ``kind``, ``prompt`` and ``tools`` (JSON), ``meta`` (JSON: the
  reference answer, ...), ``tool_call_format`` (``hermes``, verl's Qwen parser)
  and ``tool_selection`` (the task's tools: verl offers only these to the rollout).
* slca: the same file loads with ``slca.env.load_tasks`` (format ``verl``: the
  top-level ``prompt``, ``tools`` and ``reward_model`` columns) to the same
  tasks, so ``slca train --suite data/toolworld/train.parquet`` and verl train
  and score the same thing.

Usage::

    python examples/verl/prepare_data.py --out data/toolworld
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from slca.env.loaders import row_meta, task_to_row
from slca.env.toolworld import TOOLS, make_tasks

DATA_SOURCE = "slca_toolworld"


def row(task, split: str) -> dict:
    """One verl row for ``task`` (see the module docstring)."""
    base = task_to_row(task, "verl")  # slca's own verl row: prompt, tools, reward_model, extra_info
    return {
        **base,
        "data_source": DATA_SOURCE,
        "agent_name": "slca_tool_agent",
        "ability": "tool_use",
        "extra_info": {
            **base["extra_info"],
            "index": task.id,
            "split": split,
            "kind": task.kind,
            "prompt": json.dumps(task.messages),
            "tools": json.dumps(task.tools),
            "meta": json.dumps(row_meta(task), default=str),  # with the reference answer and refusal flag
            "tool_call_format": "hermes",
            "tool_selection": [t["function"]["name"] for t in task.tools],
        },
    }


def tool_config(seed: int) -> dict:
    """verl's tool config: every toolworld tool answered by ``SLCASimulatedTool``."""
    return {"tools": [{"class_name": "slca.integrations.verl_tools.SLCASimulatedTool",
                       "config": {"type": "native", "seed": seed},
                       "tool_schema": {"type": "function", "function": {k: v for k, v in t["function"].items()
                                                                        if k in ("name", "description", "parameters")}}}
                      for t in TOOLS]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/toolworld")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=None, help="tasks per split (default: all)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        rows = [row(t, split) for t in make_tasks(split, n=a.n, seed=a.seed)]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
    dumper = type("NoAliases", (yaml.SafeDumper,), {"ignore_aliases": lambda self, data: True})
    (out / "tool_config.yaml").write_text(yaml.dump(tool_config(a.seed), Dumper=dumper, sort_keys=False))
    print(f"wrote {out}/train.parquet, test.parquet, tool_config.yaml")


if __name__ == "__main__":
    main()
