"""Runs a user does not have to babysit (issue 28): paths, interrupts, resume, file modes, reports.

Behaviour that belongs to a process (exit status, SIGINT, umask) is checked on real
``python -m slca.cli`` processes; the rest in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _slca_procs import in_process, wait_until

from slca.training.config import ConfigError, load_config

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false")
SMALL = ["tasks_per_step=2", "group_size=2", "max_turns=2", "max_new_tokens=8", "eval_every=0", "eval_tasks=2", "minibatches=1",
         "report_to=none", "sample_html_every=1", "ood_splits=none"]


def slca(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slca.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env or ENV)


def sets(*items: str) -> list[str]:
    return [x for s in items for x in ("--set", s)]


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Retrying" not in r.stderr, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


# ---------------------------------------------------------------- 2: a path that is not there, a bad data file


def test_mistyped_relative_model_path_fails_at_once_and_writes_nothing(tmp_path):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    env = {k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}  # online: a hub id would be tried (and retried)
    t0 = time.time()
    r = slca("train", *sets("model=models/tin", "run_dir=runs/x", "steps=1"), cwd=tmp_path, env=env)
    line = one_error_line(r)
    assert time.time() - t0 < 30
    assert line == "error: model: 'models/tin': no such folder (did you mean 'models/tiny'?)"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["models/nonexist", "./nonexist", "models/a/b", "my model"])
def test_path_like_model_values_are_refused_as_folders(tmp_path, monkeypatch, value):
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^model: '.*': no such folder \("):
        load_config(None, [f"model={value}"])


def test_hub_id_not_cached_is_one_line_at_validation(tmp_path, monkeypatch):
    from huggingface_hub import constants

    import slca.models.loading as policy

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=r"^model: 'nobody/no-such-model': not a local folder.*HF_HUB_OFFLINE=1"):
        load_config(None, ["model=nobody/no-such-model"])
    # online, with the hub out of reach: one request, one line (no minute of retries)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []

    def unreachable(self, repo_id, **kw):
        calls.append(repo_id)
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr("huggingface_hub.HfApi.model_info", unreachable)
    policy._ask_hub.cache_clear()
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model=nobody/other-model"])
    assert str(e.value) == ("model: 'nobody/other-model': no such folder, not in the Hugging Face cache, and the hub could not be reached "
                            "([Errno -2] Name or service not known); download it once where there is network, or pass a save_pretrained folder")
    assert calls == ["nobody/other-model"]
    policy._ask_hub.cache_clear()


def test_malformed_data_file_leaves_no_run_folder(tmp_path, tiny_model_dir):
    (tmp_path / "tasks.jsonl").write_text('{"id": 1, "messages": [\n')
    r = in_process("train", *sets(f"model={tiny_model_dir}", "suite=tasks.jsonl", "run_dir=runs/x", "steps=1"), cwd=tmp_path)
    assert "tasks.jsonl" in one_error_line(r)
    assert not (tmp_path / "runs").exists()


def test_a_refused_start_leaves_an_existing_run_as_it_was(tmp_path, tiny_model_dir):
    """--overwrite empties the folder only once the new run's tasks and model have loaded."""
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "config.json").write_text("{}")
    (tmp_path / "tasks.jsonl").write_text("not json\n")
    r = in_process("train", "--overwrite", *sets(f"model={tiny_model_dir}", "suite=tasks.jsonl", "run_dir=runs/x", "steps=1"), cwd=tmp_path)
    one_error_line(r)
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "metrics.jsonl"] and (run / "config.json").read_text() == "{}"


# ---------------------------------------------------------------- 3: the logged lr is the rate the update used


def test_logged_lr_is_the_rate_of_the_steps_update(tmp_path, tiny_model_dir, monkeypatch):
    import torch

    from slca.training.trainer import train

    cfg = load_config(None, [*SMALL, f"model={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", "steps=3", "save_every=0",
                             "sample_html_every=0", "lr=2e-4", "warmup_steps=4", "minibatches=2"])
    used, real_step = [], torch.optim.AdamW.step

    def spy(self, *a, **kw):
        used.append(self.param_groups[0]["lr"])
        return real_step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert used == pytest.approx([5e-5, 5e-5, 1e-4, 1e-4, 1.5e-4, 1.5e-4])  # two minibatches per step; warmup 1/4, 2/4, 3/4
    assert [r["lr"] for r in rows] == pytest.approx([5e-5, 1e-4, 1.5e-4])


# ---------------------------------------------------------------- 4: Ctrl-C says where the run stopped and how to resume


def test_ctrl_c_says_the_step_what_is_saved_and_the_resume_command(tmp_path, tiny_model_dir):
    import shlex
    import signal

    # the signal is sent once any checkpoint exists (keep_checkpoints=1 prunes step 1's as step 2's is saved: on a fast
    # machine a step takes ~0.15 s, shorter than a poll may see) and must land before the run ends: 500 steps take
    # over a minute there, so the run cannot end first, on a fast machine or a busy one
    args = sets(*SMALL, f"model={tiny_model_dir}", "run_dir=runs/x", "steps=500", "save_every=1", "keep_checkpoints=1")
    # SIGINT at its default in the child: a shell that starts pytest in the background without job control leaves
    # SIGINT ignored, the child inherits that, and Python then installs no KeyboardInterrupt handler at all
    p = subprocess.Popen([sys.executable, "-m", "slca.cli", "train", *args], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_until(lambda: any((tmp_path / "runs" / "x" / "checkpoints").glob("step-*")), 300, "the first checkpoint", p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130, (out[-2000:], err[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    lines = err.strip().splitlines()[-3:]
    assert lines[0].startswith("interrupted (Ctrl-C): ") and " of 500 steps done" in lines[0], err
    done = int(lines[0].split(": ")[1].split()[0])
    assert 1 <= done < 500
    ckpt = sorted((tmp_path / "runs" / "x" / "checkpoints").glob("step-*"))[-1]
    assert lines[1].startswith(f"saved: the checkpoint of step {int(ckpt.name[5:])} (runs/x/checkpoints/{ckpt.name})"), lines
    assert lines[2].startswith("resume: slca train "), lines
    # the command it prints continues the run to its end (here a nearer end: steps may change on resume)
    cmd = shlex.split(lines[2].removeprefix("resume: "))
    end = done + 2
    r = subprocess.run([sys.executable, "-m", "slca.cli", *cmd[1:], "--set", f"steps={end}"], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "resumed from step" in r.stdout
    rows = [json.loads(x) for x in (tmp_path / "runs" / "x" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, end + 1))


def test_ctrl_c_before_training_started_says_nothing_was_written(tmp_path):
    from slca.cli import interrupted_lines

    cfg = load_config(None, [f"run_dir={tmp_path / 'x'}"])
    assert interrupted_lines(cfg) == ["interrupted (Ctrl-C) before training started; nothing was written"]


# ---------------------------------------------------------------- 5: --resume RUN_DIR continues with the stored config


def test_resume_run_dir_continues_with_the_stored_config(tmp_path, tiny_model_dir):
    # the first run and the refusals in this process; the resume that reads the stored config in a process of its own
    first = in_process("train", *sets(*SMALL, f"model={tiny_model_dir}", "run_dir=runs/x", "steps=1", "lr=5e-4", "seed=3"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    line = one_error_line(in_process("train", "--resume", "runs/x", *sets("steps=2", "lr=1e-3"), cwd=tmp_path))
    assert line == ("error: --resume: the config differs from the run's config.json: lr: 0.0005 -> 0.001 "
                    "(on resume only steps, micro_batch_size, eval_batch_size, eval_every, diag_every, volatility_window, sample_html_every, save_every, "
                    "keep_checkpoints, report_to, project, mask_check_max_mismatch may change; for another config train a new run_dir, or pass --overwrite to "
                    "delete this run and start over)")
    line = one_error_line(in_process("train", "runs/x", cwd=tmp_path))
    assert line.startswith("error: RUN_DIR: a run folder is given only with --resume")
    # nothing retyped: every --set of the first run comes from runs/x/config.json; steps may change
    r = slca("train", "--resume", "runs/x", *sets("steps=2"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resumed from step 1" in r.stdout
    stored = json.loads((tmp_path / "runs" / "x" / "config.json").read_text())
    assert (stored["steps"], stored["lr"], stored["seed"], stored["model"]) == (2, 5e-4, 3, str(tiny_model_dir))
    assert [json.loads(x)["step"] for x in (tmp_path / "runs" / "x" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_config_reads_the_folder_it_is_in_now(tmp_path, monkeypatch):
    from slca.training.config import TrainConfig, resume_config, to_dict

    monkeypatch.chdir(tmp_path)
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / "config.json").write_text(json.dumps({**to_dict(TrainConfig(run_dir="runs/old", lr=1e-3, seed=7))}))
    cfg = resume_config("moved")
    assert (cfg.run_dir, cfg.lr, cfg.seed) == ("moved", 1e-3, 7)
    assert resume_config(None, None, ["run_dir=moved", "steps=50"]).steps == 50  # the flag alone: run_dir from --set
    assert resume_config(None, tmp_path / "moved" / "config.json", ["run_dir=moved"]).lr == 1e-3  # -c RUN_DIR/config.json
    assert resume_config(None, None, ["run_dir=fresh"]).lr == TrainConfig().lr  # no run there yet: the given config
    with pytest.raises(ConfigError, match=r"^--resume: continues 'moved', but run_dir is set to 'elsewhere'"):
        resume_config("moved", None, ["run_dir=elsewhere"])
    with pytest.raises(ConfigError, match=r"^--resume: 'nope': no such folder"):
        resume_config("nope")
    with pytest.raises(ConfigError, match=r"^lrr: unknown config field \(did you mean 'lr'\?\)"):
        resume_config("moved", None, ["lrr=1"])


# ---------------------------------------------------------------- 6: run files get the user's umask


def test_run_files_get_the_users_umask(tmp_path, tiny_model_dir):
    mask = 0o027  # neither the 0600 / 0700 of temporary files nor the usual 022
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "slca.cli", "train", *args], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                              timeout=600, preexec_fn=lambda: os.umask(mask))

    r = run(*sets(*SMALL, f"model={tiny_model_dir}", "run_dir=runs/x", "steps=1", "save_every=1"))
    assert r.returncode == 0, r.stderr[-2000:]
    r = run("--resume", "runs/x")  # a finished run resumed: config.json, metrics.jsonl and samples.json are rewritten
    assert r.returncode == 0, r.stderr[-2000:]
    d = tmp_path / "runs" / "x"
    file_mode, dir_mode = 0o666 & ~mask, 0o777 & ~mask
    modes = {p.relative_to(d).as_posix(): p.stat().st_mode & 0o777 for p in [d, *d.rglob("*")]}
    want = {k: (dir_mode if (d / k).is_dir() else file_mode) for k in modes}
    assert modes == want
    assert {"config.json", "metrics.jsonl", "samples.json", "checkpoints/step-000001", "checkpoints/step-000001/manifest.json"} <= set(modes)


# ---------------------------------------------------------------- 7: slca report A B writes into no run folder


def _fake_run(d: Path, vals: list[float]) -> Path:
    d.mkdir(parents=True)
    rows = [{"step": i + 1, "reward/tool": v, "reward/summary": 1 - v, "eval/success": v} for i, v in enumerate(vals)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "report.md").write_text("A's own report\\n")
    return d


def test_report_of_several_runs_goes_to_a_new_folder(tmp_path):
    a, b = _fake_run(tmp_path / "runs" / "a", [0.1, 0.2]), _fake_run(tmp_path / "runs" / "b", [0.3, 0.4])
    before = {p: p.read_bytes() for p in (tmp_path / "runs").rglob("*") if p.is_file()}
    for n, folder in ((1, "slca-report"), (2, "slca-report-2")):
        r = in_process("report", "runs/a", "runs/b", cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"report: {folder}/report.md" in r.stdout
        assert "| a " in (tmp_path / folder / "report.md").read_text()
    after = {p: p.read_bytes() for p in (tmp_path / "runs").rglob("*") if p.is_file()}
    assert after == before  # neither run folder was written into
    # one run: its own report, in its own folder (as slca train writes it)
    r = in_process("report", "runs/a", cwd=tmp_path)
    assert r.returncode == 0 and "report: runs/a/report.md" in r.stdout
    assert (a / "report.md").read_text() != "A's own report\\n" and (a / "curves.png").exists() and b.exists()


# ---------------------------------------------------------------- 8: every gradient figure says what it aggregates


def test_gradient_metrics_say_what_they_aggregate(tmp_path, tiny_model_dir, monkeypatch):
    import math

    import torch

    from slca.training.trainer import train

    cfg = load_config(None, [*SMALL, f"model={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", "steps=2", "save_every=0", "minibatches=2",
                             "ppo_epochs=2", "diag_every=2", "sample_html_every=0", "summary_noise=0.5"])
    norms, real = [], torch.nn.utils.clip_grad_norm_

    def spy(*a, **kw):
        n = real(*a, **kw)
        norms.append(float(n))
        return n

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(norms) == 8  # 2 steps x 2 epochs x 2 minibatches
    for r, step_norms in zip(rows, (norms[:4], norms[4:])):
        assert r["grad/norm"] == pytest.approx(sum(step_norms) / 4, rel=1e-6)  # the mean over the step's minibatches
    first, second = rows
    assert "grad/tool_norm" not in second and "grad/first_minibatch_norm" not in second  # not a diagnostic step
    # the per-segment norms split the gradient of the step's first minibatch, logged next to them
    assert first["grad/first_minibatch_norm"] == pytest.approx(norms[0], rel=1e-6)
    t, s, cos = first["grad/tool_norm"], first["grad/summary_norm"], first["grad/cosine_tool_summary"]
    if cos is None:  # NaN: a segment without gradient (a random tiny model rarely calls a tool)
        assert 0.0 in (t, s)
        cos = 0.0
    assert norms[0] > 0 and math.sqrt(t * t + s * s + 2 * t * s * cos) == pytest.approx(norms[0], rel=1e-3)


# ---------------------------------------------------------------- 1: a LoRA checkpoint loads from any folder


def test_lora_checkpoint_loads_from_any_folder_and_says_when_its_base_is_gone(tmp_path, tiny_model_dir, monkeypatch):
    import shutil

    pytest.importorskip("peft")
    from slca.models.loading import load_policy
    from slca.training.trainer import train

    a = tmp_path / "a"
    shutil.copytree(tiny_model_dir, a / "models" / "tiny")
    monkeypatch.chdir(a)
    train(load_config(None, [*SMALL, "model=models/tiny", "run_dir=runs/x", "steps=1", "save_every=1", "sample_html_every=0",
                             "lora_r=4", "lora_target_modules=q_proj,v_proj"]))
    ckpt = a / "runs" / "x" / "checkpoints" / "step-000001"
    adapter = json.loads((ckpt / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(a / "models" / "tiny")  # absolute: found from anywhere
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    from safetensors.torch import load_file

    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    for base in (str(a / "models" / "tiny"), "models/tiny"):  # "models/tiny": as checkpoints before recorded it
        (ckpt / "adapter_config.json").write_text(json.dumps({**adapter, "base_model_name_or_path": base}))
        model, _ = load_policy(str(ckpt))
        lora = {k: v for k, v in model.state_dict().items() if "lora_B" in k}
        assert len(lora) == len([k for k in saved if "lora_B" in k]) > 0
        assert all(float(v.abs().sum()) > 0 for v in lora.values())  # the trained adapters, not fresh zeros
        assert load_config(None, [f"model={ckpt}"]).model == str(ckpt)
        del model
    # the base model really gone: one line, at once, naming it (no hub retries)
    shutil.move(a / "models", tmp_path / "elsewhere")
    env = {k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}
    t0 = time.time()
    line = one_error_line(slca("eval", "--model", str(ckpt), "--suite", "toolworld", "--limit", "1", "--out", "ev", cwd=tmp_path / "b", env=env))
    assert time.time() - t0 < 60
    assert line.startswith(f"error: --model {str(ckpt)!r}: a LoRA checkpoint of the base model 'models/tiny', which is not there "
                           "(looked in the working folder and in each folder above the checkpoint); put the base model back, "
                           "or set base_model_name_or_path in"), line
    with pytest.raises(ConfigError, match=r"^model: a LoRA checkpoint of the base model 'models/tiny', which is not there"):
        load_config(None, [f"model={ckpt}"])


# ---------------------------------------------------------------- 9: small things


def test_a_run_writes_nothing_to_stderr(tmp_path, tiny_model_dir):
    """No transformers progress bars (loading, saving) and no FutureWarnings (LoRA's peft included)."""
    pytest.importorskip("peft")
    r = slca("train", *sets(*SMALL, f"model={tiny_model_dir}", "run_dir=runs/x", "steps=1", "save_every=1", "lora_r=2"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr == ""


def test_plots_tick_whole_steps(tmp_path, monkeypatch):
    import matplotlib.figure

    from slca.reporting.compare import _plot_curves
    from slca.training.experiments import RunSpec
    from slca.reporting.report import write_report

    figures = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **kw: (figures.append(self), real(self, *a, **kw))[1])
    runs = [_fake_run(tmp_path / f"r{i}", [0.1 * i, 0.2, 0.3]) for i in range(2)]  # three steps: matplotlib would tick 0.5
    write_report({"a": runs[0], "b": runs[1]}, tmp_path / "out")
    _plot_curves([RunSpec("grpo", i, d) for i, d in enumerate(runs)], ["grpo"], tmp_path / "c.png")
    assert len(figures) == 2
    for fig in figures:
        for ax in fig.axes:
            if ax.lines:
                ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
                assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)


@pytest.mark.parametrize("given,meant", [("learning_rate", "lr"), ("num_generations", "group_size"), ("beta", "kl_coef"), ("lrr", "lr")])
def test_trl_names_get_a_did_you_mean(given, meant):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{given}=1"])
    assert str(e.value).startswith(f"{given}: unknown config field (did you mean {meant!r}?")


def test_a_row_of_no_known_format_names_the_keys_each_needs(tmp_path):
    from slca.env import load_tasks

    (tmp_path / "t.jsonl").write_text(json.dumps({"question": "hi", "answer": "x"}) + "\n")
    with pytest.raises(ValueError) as e:
        load_tasks(tmp_path / "t.jsonl")
    msg = str(e.value)
    assert "format=" not in msg  # the CLI has no such option
    assert "a slca row has 'messages' and 'gold', a verl row 'prompt' and 'reward_model'" in msg


@pytest.mark.parametrize("args,line", [
    (["compare", "--jobs", "abc"], "error: --jobs: Input should be a valid integer"),
    (["train", "--nope"], "error: No such option: --nope"),
    (["trian"], "error: No such command 'trian'. Did you mean 'train'?"),
])
def test_usage_errors_are_one_line(tmp_path, args, line):
    got = one_error_line(in_process(*args, cwd=tmp_path))
    assert got.startswith(line) and got.endswith("--help)"), got
