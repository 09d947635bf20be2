"""Interleaved A/B of ``TrainConfig.group_minibatches`` (off vs on) on bench_step's multi-turn workload.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_group_minibatches.py

Four slca trainers (minibatches 2 and 4, each with rows or whole groups per
minibatch) take one step each in turn: 1 warm-up round, then ``--repeats``
timed rounds. Prints the median process CPU seconds per step (1 thread).
The output of the recorded run is docs/results/perf19/group_minibatches.txt.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _common as C  # noqa: E402
import bench_step as B  # noqa: E402
import torch  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    tok = C.build_tokenizer(C.FULL.vocab)
    trainers, times = {}, {}
    for mb in (2, 4):
        for grp in (False, True):
            tr = B.slca_trainer(tok, C.FULL, True, tempfile.mkdtemp(), minibatches=mb)
            tr.cfg = dataclasses.replace(tr.cfg, group_minibatches=grp)
            trainers[(mb, grp)], times[(mb, grp)] = tr, []
    for rep in range(a.repeats + 1):
        for key, tr in trainers.items():
            c = time.process_time()
            tr.train_step()
            if rep:
                times[key].append(time.process_time() - c)
    for (mb, grp), ts in times.items():
        print(f"minibatches {mb} group_minibatches {grp}: median {statistics.median(ts):.2f} CPU-s/step  {[round(x, 2) for x in ts]}")


if __name__ == "__main__":
    main()
