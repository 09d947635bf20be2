"""Every config field validated before any work starts; each refusal one `error: <field>: ...` line, exit 2."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import typing

import pytest
from typer.testing import CliRunner

from slca.cli import app
from slca.training.config import GROUPS, ConfigError, TrainConfig, config_diff, load_config, validate

runner = CliRunner()
FLOAT_FIELDS = [f.name for f in dataclasses.fields(TrainConfig) if typing.get_type_hints(TrainConfig)[f.name] is float]


def test_every_field_carries_its_help_and_check():
    """A new field says what a valid value is where it is declared: a Literal, or Annotated checks (bools: the type)."""
    hints = typing.get_type_hints(TrainConfig, include_extras=True)
    for f in dataclasses.fields(TrainConfig):
        assert f.metadata.get("help"), f.name
        hint = hints[f.name]
        checked = typing.get_origin(hint) in (typing.Annotated, typing.Literal) or hint is bool
        assert checked, f"{f.name}: {hint} declares no check"
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    starts = [names.index(k) for k in GROUPS]
    assert starts == sorted(starts) and starts[0] == 0  # each group's first field, in declaration order


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_nan_and_inf_refused_for_every_float_field(name, bad):
    with pytest.raises(ConfigError, match=rf"^{name}: must be a finite number"):
        load_config(None, [f"{name}={bad}"])
    with pytest.raises(ConfigError, match=rf"^{name}: must be a finite number"):
        validate(dataclasses.replace(TrainConfig(), **{name: float(bad)}))  # NaN from a YAML/JSON file or from Python


@pytest.mark.parametrize(
    "override, message",
    [
        ("max_grad_norm=-1", "max_grad_norm: must be > 0"),   # flipped every gradient
        ("max_grad_norm=0", "max_grad_norm: must be > 0"),    # froze training
        ("lr=0", "lr: must be > 0"),
        ("lr=-0.001", "lr: must be > 0"),
        ("keep_checkpoints=-1", "keep_checkpoints: must be >= 1 (or 0 = keep every checkpoint)"),
        ("model=/no/such/model", "model: '/no/such/model': no such folder"),
        ("suite=/no/such/tasks.jsonl", "suite: '/no/such/tasks.jsonl': not 'toolworld' and no such file"),
        ("device=tpu", "device: 'tpu' is not a torch device"),
        ("tool_format=xml", "tool_format: must be a tool-call format"),
        ("seed=-1", "seed: must be in [0, 4294967295]"),
        ("seed=1.5", "seed: must be an integer"),
        ("run_dir=", "run_dir: must name a folder"),
        ("lrr=0.1", "lrr: unknown config field (did you mean 'lr'?)"),
        ("clip_low=1", "clip_low: must be in [0, 1)"),
        ("loss_agg=per_turn", "loss_agg: must be one of ['token_mean', 'seq_mean', 'token_sum_norm', 'segment_balanced', "
                              "'turn_mean'], got 'per_turn'"),
        ("minibatches=999", "minibatches: 999 exceeds the batch size"),
        ("steps", "--set: 'steps' must look like field=value"),
    ],
)
def test_bad_values_refused_naming_the_field(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(message), str(e.value)
    assert e.value.field == message.split(":")[0]


def test_every_loss_aggregation_is_a_choice():
    from slca.core.losses import AGG_MODES

    assert "turn_mean" in AGG_MODES
    for mode in AGG_MODES:
        assert load_config(None, [f"loss_agg={mode}"]).loss_agg == mode


def test_cuda_refused_where_there_is_none():
    import torch

    if torch.cuda.is_available():
        assert load_config(None, ["device=cuda"]).device == "cuda"
        with pytest.raises(ConfigError, match="device: 'cuda:99'"):
            load_config(None, ["device=cuda:99"])
    else:
        with pytest.raises(ConfigError, match="device: 'cuda': CUDA is not available"):
            load_config(None, ["device=cuda"])


def test_keep_checkpoints_zero_means_keep_all_and_paths_accepted(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "t.jsonl").write_text("")
    cfg = load_config(None, ["keep_checkpoints=0", f"model={tmp_path / 'm'}", f"suite={tmp_path / 't.jsonl'}"])
    assert cfg.keep_checkpoints == 0
    with pytest.raises(ConfigError, match="model: .*no config.json"):
        load_config(None, [f"model={tmp_path}"])
    with pytest.raises(ConfigError, match="run_dir: .* is not a folder"):
        load_config(None, [f"run_dir={tmp_path / 't.jsonl'}"])


def test_file_values_checked_like_overrides(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"kl_coef": NaN}')
    with pytest.raises(ConfigError, match="kl_coef: must be a finite number"):
        load_config(p)
    y = tmp_path / "c.yaml"
    y.write_text("summary_noise: .nan\n")
    with pytest.raises(ConfigError, match="summary_noise: must be a finite number"):
        load_config(y)
    y.write_text("steps: [3]\n")
    with pytest.raises(ConfigError, match=r"steps: must be int, got \[3\]"):
        load_config(y)
    y.write_text("estimator: grpo\nlr: 1e-3\nwarmup_steps: 0\n")
    cfg = load_config(y)
    assert (cfg.estimator, cfg.lr, cfg.warmup_steps) == ("grpo", 1e-3, 0)
    y.write_text("")  # an empty file is no overrides
    assert load_config(y) == TrainConfig()


def test_malformed_files_named_with_their_line(tmp_path):
    y = tmp_path / "bad.yaml"
    y.write_text("steps: 3\nlr: [1\n")
    with pytest.raises(ConfigError) as e:
        load_config(y)
    assert str(e.value).startswith(f"{y}:3: malformed YAML") and "line 3" in str(e.value)
    j = tmp_path / "bad.json"
    j.write_text('{"steps": 3,\n "lr": }\n')
    with pytest.raises(ConfigError) as e:
        load_config(j)
    assert str(e.value).startswith(f"{j}:2: malformed JSON: Expecting value (line 2, column 8)")
    t = tmp_path / "list.yaml"
    t.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping of field: value, got list"):
        load_config(t)
    with pytest.raises(ConfigError, match="config file does not exist"):
        load_config(tmp_path / "missing.yaml")
    b = tmp_path / "bin.yaml"
    b.write_bytes(b"steps: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(b)


def test_config_diff_names_each_changed_field():
    stored = dict(dataclasses.asdict(TrainConfig()), lr=1e-3, run_dir="elsewhere")
    stored.pop("kl_kind")  # a run saved before a field existed: the default counts
    assert config_diff(stored, TrainConfig()) == ["lr: 0.001 -> 0.0002"]
    assert config_diff({**stored, "old_field": 1}, TrainConfig(lr=1e-3)) == ["old_field: 1 -> (no longer a config field)"]


# ---------------------------------------------------------------- the CLI: one line, exit 2, before any work


def _one_error_line(res, starts: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {starts}"), res.stderr
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    "args, starts",
    [
        (["train", "--set", "max_grad_norm=-1"], "max_grad_norm: must be > 0"),
        (["train", "--set", "tool_weight=inf"], "tool_weight: must be a finite number"),
        (["train", "--set", "suite=/nope.jsonl"], "suite:"),
        (["train", "--set", "tool_format=xml"], "tool_format:"),
        (["train", "--resume", "--overwrite"], "--overwrite: --resume and --overwrite exclude each other"),
        (["compare", "--set", "lr=nan"], "lr: must be a finite number"),
        (["compare", "--seeds", "0,x"], "--seeds:"),
        (["compare", "--seeds", "0,0"], "--estimators / --seeds: each may appear once"),
        (["compare", "--jobs", "0"], "--jobs: must be >= 1"),
        (["compare", "--set", "seed=3"], "--set: may not change estimator, seed or run_dir"),
        (["eval", "--model", "default", "--suite", "toolworld", "--format", "xml"], "--format: must be one of"),
        (["eval", "--model", "default", "--suite", "toolworld", "--temperature", "nan"], "--temperature: must be a finite number"),
        (["eval", "--model", "default", "--suite", "toucan", "--data", "/no/rows.jsonl"], "--data: must be an existing file"),
        (["eval", "--model", "default", "--suite", "toolworld", "--samples", "0"], "--samples: must be >= 1"),
        (["eval", "--model", "default", "--suite", "toolworld", "--categories", "weird"], "--categories ['weird']: task kinds here are"),
        (["report", "/no/such/run"], "/no/such/run: not a run folder"),
    ],
)
def test_cli_refusals_before_any_work(args, starts, tmp_path, monkeypatch):
    monkeypatch.setenv("SLCA_CACHE", str(tmp_path / "cache"))  # the embedded model would be built here
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*args, *(["--set", f"run_dir={tmp_path / 'run'}"] if args[0] == "train" else [])])
    _one_error_line(res, starts)
    assert not (tmp_path / "cache").exists(), "refused only after starting to build the model"
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists(), "refused only after making a run folder"


def test_cli_malformed_config_file_no_traceback(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("steps: 3\n  lr: 1\n")
    r = subprocess.run([sys.executable, "-m", "slca.cli", "train", "-c", str(y)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {y}:2: malformed YAML") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_override_strings_coerced_by_annotation():
    """Fields of other types (optional, lists, booleans) slot into the same table."""
    from slca._fields import _type_ok
    from slca.training.config import _coerce

    assert _coerce("f", "a, b", list[str]) == ["a", "b"]
    assert _coerce("f", "none", int | None) is None and _coerce("f", "3", int | None) == 3
    assert _coerce("f", "yes", bool) is True and _coerce("f", "0", bool) is False
    with pytest.raises(ConfigError, match="f: must be a boolean"):
        _coerce("f", "maybe", bool)
    assert _type_ok(None, int | None) and _type_ok(["a"], list[str]) and not _type_ok([1], list[str])
    assert not _type_ok(True, int) and _type_ok(3, float) and not _type_ok("3", float)


def test_all_float_defaults_finite():
    assert all(math.isfinite(getattr(TrainConfig(), n)) for n in FLOAT_FIELDS)


def test_estimator_options_reach_the_estimator_from_set_and_from_files(tmp_path):
    """`cond_std` (an option no config field holds) from --set or a file, checked by slca_cond's options object."""
    from slca.core.registry import SLCAOptions
    from slca.training.config import estimator_options

    cfg = load_config(None, ["estimator=slca_cond", "estimator_options=cond_std=subgroup", "empty_tool=include"])
    opts = estimator_options(cfg)
    assert (opts.cond_std, opts.empty_tool, opts.eps) == ("subgroup", "include", 1e-6)
    assert estimator_options(cfg, "slca") == SLCAOptions(empty_tool="include")  # the recorded reference estimators
    y = tmp_path / "c.yaml"
    y.write_text("estimator: slca_turn\nestimator_options: {turn_lambda: 0.5}\n")
    with pytest.raises(ConfigError, match="may not set 'turn_lambda': it comes from the config field 'turn_lambda'"):
        load_config(y)
    y.write_text("estimator: slca_cond\nestimator_options: {cond_std: subgroup}\n")
    assert estimator_options(load_config(y)).cond_std == "subgroup"
    for sets, message in [
        (["estimator=slca_cond", "estimator_options=cond_std=x"], "estimator_options: estimator 'slca_cond': option 'cond_std' must be one of"),
        (["estimator_options=cond_std=subgroup"], "estimator_options: estimator 'slca' has no option 'cond_std'"),
        (["estimator_options=scale=none"], "estimator_options: may not set 'scale': it comes from the config field 'scale'"),
        (["estimator_options=cond_std"], "estimator_options: 'cond_std' must look like option=value"),
        (["estimator=slca_turn", "turn_lambda=-1"], "turn_lambda: must be >= 0"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(None, sets)
        assert str(e.value).startswith(message), str(e.value)


def test_help_config_lists_the_fields_in_their_groups():
    r = runner.invoke(app, ["train", "--help-config"])
    assert r.exit_code == 0, r.output
    heads = [ln.strip() for ln in r.output.splitlines() if ln.strip() in GROUPS.values()]
    assert heads == list(GROUPS.values())
    assert "estimator_options = []" in r.output and "Dr. GRPO" in r.output  # scale's help, from GroupOptions
