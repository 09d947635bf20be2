"""A warm start on the four cells of entities x phrasings (seen / unseen), greedy, tool-needing tasks.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/warmstart_cells.py --model-dir DIR --out docs/results/warmstart27/NAME [--n 300]
    .venv/bin/python scripts/warmstart_cells.py --table docs/results/warmstart27/NAME ...   # the rows of saved cells

Runs ``scripts/warmstart_report.py --split S --seed 0 --modes greedy --tool-tasks`` on
``train_heldout`` (seen x seen), ``test_entities`` (unseen entities), ``test_phrasings``
(unseen phrasings) and ``test`` (both unseen), one process each, writes ``OUT/<split>.json``
(a split already written is skipped, so a stopped run resumes) and prints the markdown rows
of docs/warmstart.md's four-cell table with the CPU seconds of each cell.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

CELLS = (("seen x seen", "train_heldout"), ("unseen x seen", "test_entities"), ("seen x unseen", "test_phrasings"),
         ("unseen x unseen", "test"))
COLUMNS = ("parse", "Name F1", "ArgMatch", "tool-task success", "single", "parallel", "chain", "parallel split",
           "summary reward", "wrong entity")


def row(label: str, split: str, rec: dict) -> str:
    a, k = rec["greedy"]["all"], rec["greedy"]["by_kind"]
    vals = (a["parseable_call_rate"], a["name_f1"], a["arg_match"], a["success"], k["single"]["success"], k["parallel"]["success"],
            k["chain"]["success"], a["parallel_tasks_split_over_turns"], a["summary_reward"], a["summary.wrong_entity"])
    return f"| {label} | `{split}` | " + " | ".join(f"{v:.3f}" for v in vals) + " |"


def table(dirs: list[Path]) -> str:
    lines = ["| build | entities x phrasings | split | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 3)]
    for d in dirs:
        for label, split in CELLS:
            f = d / f"{split}.json"
            if f.exists():
                lines.append(f"| {d.name} " + row(label, split, json.loads(f.read_text())))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", help="a saved build (AutoModelForCausalLM / AutoTokenizer folder)")
    ap.add_argument("--out", help="folder for the four JSON records")
    ap.add_argument("--n", type=int, default=300, help="tool-needing tasks per cell")
    ap.add_argument("--table", nargs="*", help="only print the rows of these saved folders")
    args = ap.parse_args()
    if args.table is not None:
        print(table([Path(d) for d in args.table]))
        return
    if not (args.model_dir and args.out):
        ap.error("--model-dir and --out are required (or --table)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Path(__file__).resolve().parent / "warmstart_report.py"
    for _, split in CELLS:
        dest = out / f"{split}.json"
        if dest.exists():
            continue
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        subprocess.run([sys.executable, str(report), "--model-dir", args.model_dir, "--n", str(args.n), "--split", split, "--seed", "0",
                        "--modes", "greedy", "--tool-tasks", "--json", str(dest) + ".part"], check=True)
        rec = json.loads(Path(str(dest) + ".part").read_text())
        rec["cost"] = {"wall_s": time.perf_counter() - t0, "cpu_s": resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - c0,
                       "n": args.n, "model_dir": args.model_dir}
        dest.write_text(json.dumps(rec, indent=1))
        Path(str(dest) + ".part").unlink()
        print(f"{split}: {rec['cost']['cpu_s']:.0f} CPU s, {rec['cost']['wall_s']:.0f} s wall", flush=True)
    print(table([out]))


if __name__ == "__main__":
    main()
