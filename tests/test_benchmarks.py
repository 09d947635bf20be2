"""Every benchmark script runs end to end (``--tiny``), so the scripts do not rot.

Each test calls the script's ``main`` in this process with ``--tiny --threads 1``
and reads the printed table: the figures must be finite and positive, and
bench_step's two sides must have sampled the same number of policy tokens
(the identical-work guarantee of the scripted policy).
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    threads = torch.get_num_threads()

    def load(name: str):
        return importlib.import_module(name)

    yield load
    torch.set_num_threads(threads)


def rows(out: str, first: str) -> list[list[str]]:
    return [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0] == first]


def numbers(cells: list[str]) -> list[float]:
    return [float(x) for c in cells for x in re.findall(r"-?\d+\.\d+|-?\d+", c)]


@pytest.mark.slow
def test_bench_step_tiny_same_work_on_both_sides(bench, capsys):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    bench("bench_step").main(["--tiny", "--threads", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    for w in ("single", "multi"):
        (r,) = rows(out, w)
        trl_tok, slca_tok, plain_tok = r[-1].split("/")
        assert float(trl_tok) == float(slca_tok) == float(plain_tok) > 0, out
        ratios = [float(c.rstrip("x")) for c in r if c.endswith("x")]  # slca/TRL on wall and CPU time, fast/plain
        assert len(ratios) == 3 and all(math.isfinite(x) and x > 0 for x in ratios), out


@pytest.mark.parametrize("flag, expected", [(None, True), (False, False), (True, True)])
def test_bench_step_trl_checkpointing_flag_reaches_trl(bench, tmp_path, flag, expected):
    """TRL's GRPOConfig default is gradient checkpointing on; --trl-checkpointing off must really turn it off."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    B = bench("bench_step")
    C = bench("_common")
    tok = C.build_tokenizer(C.TINY.vocab)
    tr = B.trl_trainer(tok, C.TINY, False, str(tmp_path), 1, [], checkpointing=flag)
    assert tr.args.gradient_checkpointing is expected


def test_bench_overhead_tiny(bench, capsys):
    bench("bench_overhead").main(["--tiny", "--threads", "1", "--repeats", "1", "--micro", "3"])
    out = capsys.readouterr().out
    (r,) = rows(out, "1")
    vals = numbers(r)
    assert len(vals) == 9 and all(math.isfinite(v) for v in vals), out
    assert vals[6] > 0 and vals[7] > 0, out  # grpo and slca step CPU seconds


def test_bench_rollout_tiny_same_tokens(bench, capsys):
    bench("bench_rollout").main(["--tiny", "--threads", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    (r,) = rows(out, "1")
    tok_s = numbers(r[-4:-2])
    assert len(tok_s) == 2 and all(v > 0 for v in tok_s), out


def test_bench_floor_tiny(bench, capsys):
    bench("bench_floor").main(["--tiny", "--threads", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    (r,) = rows(out, "1")
    assert "GF/s" in r and "%" in " ".join(r), out
    assert all(math.isfinite(v) and v >= 0 for v in numbers(r)), out


@pytest.mark.slow
def test_bench_memory_tiny(bench, capsys):
    bench("bench_memory").main(["--tiny"])
    out = capsys.readouterr().out
    (r,) = rows(out, "trainer")
    assert r[1] == "0", out
    assert 0.05 < float(r[2]) < 3.0, out


@pytest.mark.slow
@pytest.mark.parametrize("side,micro,lora", [("slca", 0, 0), ("slca", 1, 0), ("trl", 0, 4)])
def test_bench_memory_one_side_of_a_step(bench, capsys, side, micro, lora):
    """--what step runs one side of bench_step's step alone in a child and reports its peak (slca: also with
    micro_batch_size; TRL here with LoRA adapters, as issue 42's workload trains)."""
    pytest.importorskip("trl")
    if lora:
        pytest.importorskip("peft")
    bench("bench_memory").main(["--what", "step", "--side", side, "--workload", "multi", "--tiny", "--micro-batch-size", str(micro),
                                "--lora-r", str(lora)])
    out = capsys.readouterr().out
    (r,) = rows(out, "step")
    assert r[1] == "0", out
    assert 0.05 < float(r[2]) < 3.0, out
    assert f"one {side} step, multi" in out and f"micro_batch_size {micro}" in out
    assert (f"LoRA r {lora} on q_proj,v_proj" in out) == bool(lora), out


def test_scripted_policy_follows_its_script_in_generate(bench):
    """The benchmark policy writes exactly its scripted turn under HF generate (as in TRL and slca)."""
    C = bench("_common")
    tok = C.build_tokenizer(C.TINY.vocab)
    script = C.script_turns(tok)
    model = C.build_model(tok, C.TINY, script).eval()
    msgs = [{"role": "user", "content": C.user_prompt(0, True)}]
    enc = tok.apply_chat_template(msgs, tools=[C.weather_tool_schema()], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=len(script[0]) + 5, do_sample=True)
    assert out[0, enc["input_ids"].shape[1]:].tolist() == script[0]
    # training passes (grad enabled) see the model's own logits, not the script
    logits = model(**enc).logits[0, -1]
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("script", ["gpu.sh", "gpu_smollm2.sh"])
def test_gpu_scripts_skip_cleanly_without_cuda(script):
    if torch.cuda.is_available():
        pytest.skip(f"a CUDA device is present: {script} would run")
    import subprocess

    out = subprocess.run(["bash", str(BENCH / script)], env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(f"{script}: skipped (no CUDA device"), out.stdout


def test_bench_fastpath_tiny_same_tokens(bench, capsys):
    bench("bench_fastpath").main(["--tiny", "--repeats", "1"])
    out = capsys.readouterr().out
    table = [ln.split() for ln in out.splitlines() if ln.startswith(("rollout", "prompts", "decode", "train"))]
    assert len(table) == 9, out
    for r in table:
        ratio = [c for c in r if c.endswith("x")]
        assert len(ratio) == 1 and float(ratio[0].rstrip("x")) > 0, out
    assert all("yes" in r for r in table if r[0] in ("rollout", "prompts")), out  # both sides sampled the same tokens


def test_bench_scaling_tiny_one_point(bench, capsys):
    bench("bench_scaling").main(["--tiny", "--axes", "G"])
    out = capsys.readouterr().out
    (r,) = rows(out, "G")
    assert r[2] == "slca" and int(r[3]) > 0, out
    vals = numbers(r[6:9])  # step, rollout, train CPU seconds
    assert all(math.isfinite(v) and v > 0 for v in vals) and abs(vals[0] - vals[1] - vals[2]) < 0.02, out
    assert r[-2].endswith("GB") and float(r[-2][:-2]) > 0.1, out  # peak RSS of the child


def test_bench_shared_prompt_tiny(bench, capsys):
    bench("bench_shared_prompt").main(["--tiny", "--threads", "1"])
    out = capsys.readouterr().out
    for side in ("shared", "copies"):
        (r,) = rows(out, side)
        assert all(math.isfinite(v) and v > 0 for v in numbers(r[1:])), out
    assert re.search(r"same tokens: \d+ of 4 rollouts", out), out
    assert "2 of 2 at or past" in out, out


@pytest.mark.slow
def test_bench_step_with_lora_trains_the_same_adapters_on_both_sides(bench, capsys):
    """--lora-r: both sides get fresh adapters on the same modules (slca's apply_lora) and do the same work."""
    for m in ("trl", "datasets", "peft"):
        pytest.importorskip(m)
    bench("bench_step").main(["--tiny", "--threads", "1", "--repeats", "1", "--workload", "multi", "--no-plain", "--lora-r", "4"])
    out = capsys.readouterr().out
    assert "LoRA r 4 on q_proj,v_proj" in out, out
    (r,) = rows(out, "multi")
    trl_tok, slca_tok, _ = r[-1].split("/")
    assert float(trl_tok) == float(slca_tok) > 0, out
    ratios = [float(c.rstrip("x")) for c in r if c.endswith("x")]
    assert all(math.isfinite(x) and x > 0 for x in ratios[:2]), out


def test_bench_step_lora_sides_train_only_the_same_adapters(bench, tmp_path):
    for m in ("trl", "datasets", "peft"):
        pytest.importorskip(m)
    B, C = bench("bench_step"), bench("_common")
    tok = C.build_tokenizer(C.TINY.vocab)
    lora = (4, ["q_proj", "v_proj"])
    sides = [B.slca_trainer(tok, C.TINY, True, str(tmp_path / "s"), lora=lora).model,
             B.trl_trainer(tok, C.TINY, True, str(tmp_path / "t"), 1, [], lora=lora).model]
    trained = [sorted(n.split("base_model.model.")[-1] for n, p in m.named_parameters() if p.requires_grad) for m in sides]
    assert trained[0] == trained[1] and trained[0] and all("lora_" in n and (".q_proj." in n or ".v_proj." in n) for n in trained[0])
