"""``python -m recipes.smollm2_toolworld COMMAND`` (from the repository root): the stage-1 recipe's steps.

    build    --out DIR [--set key=value ...]     train the adapter into DIR/adapter (resumable)
    ship     --adapter DIR [--records DIR]       copy it into the package (and its record into DIR/build.json)
    eval     --model M [--adapter DIR] --suite toolworld|bfcl [--split S] --out DIR
    summary  --results DIR                       the before/after tables (DIR/summary.md)
    measure  [--steps N] [--set key=value ...]   time a few optimizer steps and estimate the run's CPU time

``scripts/build_smollm2_toolworld.sh`` runs them in order. Each prints one line of JSON at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from .config import Stage1Config, apply_overrides


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipes.smollm2_toolworld", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="train the adapter (resumable)")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="a Stage1Config field (chosen by train_heldout only)")
    s = sub.add_parser("ship", help="copy a built adapter into the package")
    s.add_argument("--adapter", type=Path, required=True)
    s.add_argument("--records", type=Path, default=None, help="also copy its record here as build.json")
    e = sub.add_parser("eval", help="one evaluation (skipped when its summary.json exists)")
    e.add_argument("--model", default="smollm2-toolworld")
    e.add_argument("--adapter", default=None, help="SmolLM2 plus the adapter in this folder instead of --model")
    e.add_argument("--suite", choices=("toolworld", "bfcl"), required=True)
    e.add_argument("--split", default="train_heldout")
    e.add_argument("--min-tool-tasks", type=int, default=None)
    e.add_argument("--bfcl-limit", type=int, default=None)
    e.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("summary", help="the before/after tables")
    m.add_argument("--results", type=Path, required=True)
    t = sub.add_parser("measure", help="time a few optimizer steps")
    t.add_argument("--steps", type=int, default=4)
    t.add_argument("--skip", type=int, default=1, help="first steps left out of the mean")
    t.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    a = p.parse_args(argv)

    if a.command == "build":
        from .build import build_adapter

        rec = build_adapter(a.out, apply_overrides(Stage1Config(), a.sets))
        print(json.dumps({"fingerprint": rec["fingerprint"], "adapter": str(a.out / "adapter"), "cpu_seconds": rec["train"]["cpu_seconds"]}))
    elif a.command == "ship":
        from .build import ship_adapter

        dest = ship_adapter(a.adapter)
        if a.records is not None:
            a.records.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dest / "slca_adapter.json", a.records / "build.json")
        print(json.dumps({"shipped": str(dest)}))
    elif a.command == "eval":
        from .evaluate import BFCL_LIMIT, MIN_TOOL_TASKS, evaluate

        r = evaluate(a.model, a.suite, a.out, split=a.split, adapter=a.adapter,
                     min_tool_tasks=a.min_tool_tasks or MIN_TOOL_TASKS, bfcl_limit=a.bfcl_limit or BFCL_LIMIT)
        print(json.dumps({k: r.get(k) for k in ("model_fingerprint", "tool_tasks", "tool_task_success", "cpu_seconds", "seconds")}
                         | {"metrics": r["metrics"]}))
    elif a.command == "summary":
        from .evaluate import summarize

        print(summarize(a.results))
    elif a.command == "measure":
        from .build import measure_steps

        print(json.dumps(measure_steps(apply_overrides(Stage1Config(), a.sets), steps=a.steps, skip=a.skip)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
