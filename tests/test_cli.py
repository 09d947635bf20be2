"""slca.cli's generic parts: usage errors as one line, --help, the helpers of the result tables and of demo_verdict.

Each command's own behaviour: test_demo_cli.py, test_eval_cli.py, test_config_validation.py (refusals before
any work), test_report.py, test_compare.py, test_runs.py, test_unattended.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from slca import cli
from slca import metrics as M
from slca.cli import app, demo_verdict
from slca.training.config import TrainConfig, validate

runner = CliRunner()
COMMANDS = ["demo", "train", "report", "compare", "eval", "build-model", "export-model"]


def _run(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ usage errors: one line, exit 2


@pytest.mark.parametrize("args,line", [
    (["compare", "--jobs", "abc"], "error: --jobs: "),
    (["compare", "--level", "high"], "error: --level: "),
    (["train", "--bogus"], "error: No such option: --bogus (see slca train --help)"),
    (["nope"], "error: No such command 'nope'. (see slca --help)"),
    (["eval", "--suite", "toolworld"], "error: Missing option '--model' / '-m'. (see slca eval --help)"),
    (["report"], "error: Missing argument 'run_dirs'. (see slca report --help)"),
])
def test_usage_errors_are_one_error_line_and_exit_2(args, line):
    res = runner.invoke(app, args, prog_name="slca")
    assert res.exit_code == 2, res.output
    (got,) = res.stderr.splitlines()
    assert got.startswith(line) and got.endswith(f"(see slca {args[0]} --help)" if args[0] != "nope" else "(see slca --help)")
    assert "╭" not in res.output and "Traceback" not in res.output  # not a box, not a traceback


def test_help_lists_every_command():
    res = runner.invoke(app, ["--help"], prog_name="slca")
    assert res.exit_code == 0 and "Usage: slca" in res.output
    assert all(c in res.output for c in COMMANDS)
    bare = runner.invoke(app, [], prog_name="slca")  # plain `slca`: the help, as a usage error
    assert bare.exit_code == 2 and "Usage: slca" in bare.output and all(c in bare.output for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    res = runner.invoke(app, [command, "--help"], prog_name="slca")
    assert res.exit_code == 0 and f"Usage: slca {command}" in res.output, res.output


# ------------------------------------------------------------------ _fail and _refuse_value_errors


def test_fail_is_one_line_on_stderr_and_exit_2(capsys):
    with pytest.raises(typer.Exit) as e:
        cli._fail("model: 'x':\n  no such\tfolder")
    assert e.value.exit_code == 2
    assert capsys.readouterr().err == "error: model: 'x': no such folder\n"


def test_refuse_value_errors_turns_bad_input_into_an_error_line(monkeypatch, capsys):
    monkeypatch.delenv("SLCA_DEBUG", raising=False)
    def raising(exc):
        def fn():
            raise exc
        return fn

    assert cli._refuse_value_errors(lambda: 42) == 42
    for exc in (ValueError("lr: must be > 0"), OSError("disk full")):
        with pytest.raises(typer.Exit) as e:
            cli._refuse_value_errors(raising(exc))
        assert e.value.exit_code == 2 and capsys.readouterr().err == f"error: {exc}\n"
    with pytest.raises(KeyError):  # a bug is not bad input: it keeps its traceback
        cli._refuse_value_errors(raising(KeyError("x")))
    monkeypatch.setenv("SLCA_DEBUG", "1")  # the traceback, on request
    with pytest.raises(ValueError, match="lr: must be > 0"):
        cli._refuse_value_errors(raising(ValueError("lr: must be > 0")))


# ------------------------------------------------------------------ the tables' cells and keys


def test_num_formats_a_cell_and_says_nan_for_what_is_not_a_finite_number():
    assert cli._num(0.5) == "0.500" and cli._num(2) == "2.000" and cli._num(0.12345, ".2f") == "0.12"
    assert [cli._num(v) for v in (None, "0.5", float("nan"), float("inf"))] == ["nan"] * 4


def test_diag_mean_is_the_mean_over_the_steps_that_logged_it_signed_when_it_can_be_negative():
    rows = [{M.GRAD_COSINE.name: 0.5, M.ADV_CONTAMINATION.name: 0.25}, {M.GRAD_COSINE.name: -0.1}, {M.GRAD_COSINE.name: None}, {}]
    assert cli._diag_mean(rows, M.GRAD_COSINE) == "+0.200"  # a cosine: signed
    assert cli._diag_mean(rows, M.ADV_CONTAMINATION) == "0.250"
    assert cli._diag_mean([], M.ADV_CONTAMINATION) == "0.000"


def test_eval_rows_are_the_records_of_one_evaluation_set():
    rows = [{"step": 1, "loss": 0.1}, {"step": 0, "eval/success": 0.1}, {"step": 2, "eval_test/success": 0.2}]
    assert cli._eval_rows(rows) == [rows[1]]
    assert cli._eval_rows(rows, "eval_test") == [rows[2]]


def _table(t):
    return [c.header for c in t.columns], [list(c.cells) for c in t.columns]


def _eval_record(step: int, prefix: str, value: float) -> dict:
    return {"step": step, **{m.key(set=prefix): value for m in M.CLI_FINAL}}


def test_compare_table_reads_each_metrics_key_of_the_evaluation_set(tmp_path):
    rows = [_eval_record(0, "eval", 0.1) | _eval_record(0, "eval_test", 0.05),
            {"step": 1, M.GRAD_COSINE.name: 0.5, M.ADV_CONTAMINATION.name: 0.2},
            _eval_record(1, "eval", 0.75) | _eval_record(1, "eval_test", 0.25) | {M.EVAL_SUCCESS.key(set="eval"): None}]
    runs = {"GRPO": _run(tmp_path / "g", rows)}
    headers, cols = _table(cli._compare_table(runs, "title"))
    assert headers == ["estimator", *[m.short for m in M.CLI_FINAL], *[m.short for m in M.CLI_DIAGNOSTICS]]
    assert cols[0] == ["warm start (step 0)", "GRPO"]
    i_tool = 1 + M.CLI_FINAL.index(M.EVAL_TOOL_TASKS)
    assert cols[i_tool] == ["0.100", "0.750"]
    assert cols[1 + M.CLI_FINAL.index(M.EVAL_SUCCESS)][1] == "nan"  # logged as null
    assert [c[1] for c in cols[-2:]] == ["0.200", "+0.500"] and [c[0] for c in cols[-2:]] == ["", ""]
    # the out-of-distribution set: its own keys, no diagnostics
    headers, cols = _table(cli._compare_table(runs, "title", "eval_test", diagnostics=False))
    assert headers == ["estimator", *[m.short for m in M.CLI_FINAL]]
    assert cols[i_tool] == ["0.050", "0.250"]


def test_compare_table_without_a_warm_start_evaluation(tmp_path):
    runs = {"a": _run(tmp_path / "a", [_eval_record(3, "eval", 0.5)]), "b": _run(tmp_path / "b", [{"step": 1, "loss": 0.1}])}
    _, cols = _table(cli._compare_table(runs, "title"))
    assert cols[0] == ["a", "b"] and cols[1] == ["0.500", "nan"]


def test_eval_tables_print_the_held_out_set_first_then_each_split(tmp_path, capsys):
    rows = [_eval_record(0, "eval_test", 0.1) | _eval_record(0, "eval", 0.2) | _eval_record(0, "eval_heldout_tools", 0.3)]
    cli._print_eval_tables({"x": _run(tmp_path / "x", rows)}, "final metrics")
    out = capsys.readouterr().out
    titles = ["final metrics: held-out set (eval/*, final)",
              "final metrics: toolworld heldout_tools split, out of distribution (eval_heldout_tools/*, final)",
              "final metrics: toolworld test split, out of distribution (eval_test/*, final)"]
    at = [out.find(t) for t in titles]
    assert -1 not in at and at == sorted(at), out
    assert out.count(M.CLI_DIAGNOSTICS[0].short) == 1  # diagnostics beside the held-out set only


@pytest.mark.parametrize("budget", sorted(cli.DEMO_OVERRIDES))
def test_demo_budgets_are_valid_configs(budget):
    cfg = validate(TrainConfig(**cli.DEMO_OVERRIDES[budget]))
    # three held-out evaluations with the one at step 0 (eval_on_start): 0, 8, 16 (quick: 0, 3, 6), the study's curve
    assert cfg.steps == 2 * cfg.eval_every and cfg.steps == {"full": 16, "quick": 6}[budget]
    assert cfg.ood_eval_splits == ["fresh"]  # the split nobody chose a build or a recipe on
    for est, noise, _ in cli.DEMO_ARMS.values():
        validate(TrainConfig(estimator=est, summary_noise=noise, **cli.DEMO_OVERRIDES[budget]))


@pytest.mark.parametrize("budget", ["full", "quick"])
@pytest.mark.parametrize("model", sorted(cli.DEMO_MODEL_OVERRIDES))
def test_a_named_real_models_demo_budget_is_study42s_setting_at_three_evaluations(model, budget):
    """``slca demo --model smollm2-toolworld``: study 42's setting (a fresh LoRA r 8 on q and v, lr 5e-5) at a budget one seed
    affords, evaluated at the start, mid-run and the end on the fresh split too, two arms at a time by default."""
    b = cli.DEMO_MODEL_OVERRIDES[model][budget]
    for est, noise, _ in cli.DEMO_ARMS.values():
        cfg = validate(TrainConfig(model=model, estimator=est, summary_noise=noise, eval_on_start=True, **b))
        assert (cfg.lora_r, cfg.lora_target_modules, cfg.lr) == (8, ["q_proj", "v_proj"], 5e-5)
        assert cfg.steps == 2 * cfg.eval_every and cfg.ood_eval_splits == ["fresh"]
    assert cli.demo_budget(model, budget == "quick", None) == (b, 2) and cli.demo_budget(model, False, 1)[1] == 1
    assert cli.demo_budget("default", budget == "quick", None) == (cli.DEMO_OVERRIDES[budget], 4)


def test_the_demos_cited_study_figures_are_those_of_docs_results():
    results = (Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text(encoding="utf-8")
    for name, fig in cli.STUDY_FIGURES.items():
        assert fig in results, f"{name}: {fig} is not in docs/results.md"
        assert fig in cli.STUDY_LINE
    assert cli.DEMO_NOISE == 0.5  # study 25's stage-B summary_noise
    for name, fig in cli.STUDY42_FIGURES.items():
        assert fig in results, f"{name}: {fig} is not in docs/results.md"
        assert fig in cli.STUDY_LINES["smollm2-toolworld"]


# ------------------------------------------------------------------ demo_verdict (more cases: test_warmstart_sft.py)


def _rows(final, tool, start=0.25):
    out = ([{"step": 0, "eval/tool_tasks/success": start}] if start is not None else [])
    out += [{"step": i + 1, "loss": 0.1, "reward/tool": t} for i, t in enumerate(tool)]
    out.append({"step": len(tool), "eval/tool_tasks/success": final})
    return out


def test_demo_verdict_of_runs_not_named_grpo_and_slca_compares_nothing(tmp_path):
    runs = {"A": _run(tmp_path / "a", _rows(0.5, [0.3] * 8)), "B": _run(tmp_path / "b", _rows(0.4, [0.3] * 8))}
    lines = demo_verdict(runs)
    assert len(lines) == 2 and [ln.split(":")[0] for ln in lines] == ["A", "B"]


def test_demo_verdict_without_a_warm_start_evaluation_or_enough_steps(tmp_path):
    runs = {"GRPO": _run(tmp_path / "g", _rows(0.5, [0.3] * 3, start=None)), "SLCA": _run(tmp_path / "s", _rows(0.6, [0.3] * 3, start=None))}
    lines = demo_verdict(runs, k=2)
    # no warm start, no trend, one evaluation: no curve
    assert lines[0] == "GRPO: held-out tool-task Success on new requests of the training distribution 0.500 at step 3."
    assert lines[2].startswith("SLCA - GRPO on this seed: +0.100 on held-out tool-task Success at the end (0.600 vs 0.500)")
    assert lines[3] == cli.STUDY_LINE and len(lines) == 4


def test_demo_verdict_with_a_final_logged_as_null_compares_nothing(tmp_path):
    runs = {"GRPO": _run(tmp_path / "g", _rows(None, [0.3] * 8)), "SLCA": _run(tmp_path / "s", _rows(0.6, [0.3] * 8))}
    lines = demo_verdict(runs)
    assert "Success on new requests of the training distribution nan at step 8" in lines[0] and len(lines) == 2


def _curve(s0, s8, s16, **ood):
    return [{"step": 0, "eval/tool_tasks/success": s0, **{k: v[0] for k, v in ood.items()}},
            {"step": 8, "eval/tool_tasks/success": s8},
            {"step": 16, "eval/tool_tasks/success": s16, **{k: v[1] for k, v in ood.items()}}]


def test_demo_verdict_gives_each_arms_area_and_the_noisy_judges_change(tmp_path):
    fresh = {"eval_fresh/tool_tasks/success": (0.5, 0.6)}
    runs = {"GRPO": _run(tmp_path / "g", _curve(0.5, 0.7, 0.9, **fresh)), "SLCA": _run(tmp_path / "s", _curve(0.5, 0.9, 0.9, **fresh)),
            "GRPO, noisy judge": _run(tmp_path / "gn", _curve(0.5, 0.5, 0.9, **fresh)),
            "SLCA, noisy judge": _run(tmp_path / "sn", _curve(0.5, 0.9, 0.9, **fresh))}
    lines = demo_verdict(runs)
    assert lines[0] == ("GRPO: held-out tool-task Success on new requests of the training distribution 0.900 at step 16 (warm start "
                        "0.500); area under its curve over steps 0, 8, 16 0.700 (+0.200 on the warm start's 0.500).")
    assert lines[2].startswith("GRPO, noisy judge: ") and "over steps 0, 8, 16 0.600 (+0.100 on the warm start's 0.500)" in lines[2]
    assert lines[4] == ("SLCA - GRPO on this seed: +0.100 on the area under the held-out tool-task Success curve (0.800 vs 0.700), "
                        "+0.000 at the end (0.900 vs 0.900); one seed is one draw of tasks and weights, and cannot rank the estimators.")
    assert lines[5] == ("With a noisy summary judge (summary_noise 0.5: the answer's grader made unreliable), each estimator's area under "
                        "the held-out tool-task Success curve moved from its clean-judge arm by: GRPO -0.100 (0.700 -> 0.600), "
                        "SLCA +0.000 (0.800 -> 0.800); one seed, so not a measured effect of the judge.")
    assert lines[6] == cli.STUDY_LINE and "+0.020 ± 0.013" in lines[6] and "+0.002 ± 0.006" in lines[6]
    assert lines[7].startswith("Out of distribution (toolworld's fresh split: names and phrasings new to toolworld), tool-task "
                               "Success was 0.500 before training and GRPO 0.600, SLCA 0.600, GRPO, noisy judge 0.600")
    assert len(lines) == 8


def test_demo_verdict_says_a_tie_at_the_ceiling_is_one_and_reads_an_older_demos_test_split(tmp_path):
    test = {"eval_test/tool_tasks/success": (0.2, 0.2)}
    runs = {"GRPO": _run(tmp_path / "g", _curve(0.9, 1.0, 1.0, **test)), "SLCA": _run(tmp_path / "s", _curve(0.9, 1.0, 1.0, **test))}
    lines = demo_verdict(runs)
    assert "+0.000 at the end (1.000 vs 1.000); both end at 1.000, the ceiling, where nothing is left to separate them;" in lines[2]
    assert lines[3] == cli.STUDY_LINE  # no noisy-judge arms, no sentence about them
    assert lines[4].startswith("Out of distribution (toolworld's test split: unseen entities and phrasings)") and len(lines) == 5


def test_demo_verdict_on_smollm2_toolworld_cites_the_study_on_that_model(tmp_path):
    runs = {"GRPO": _run(tmp_path / "g", _curve(0.9, 1.0, 1.0)), "SLCA": _run(tmp_path / "s", _curve(0.9, 1.0, 1.0))}
    lines = demo_verdict(runs, model="smollm2-toolworld")
    assert lines[3] == cli.STUDY_LINES["smollm2-toolworld"] and "study 42" in lines[3] and "study 25" not in lines[3]
    assert demo_verdict(runs, model="smollm2")[3] == cli.STUDY_LINE  # another model: the embedded model's studies
    assert len(lines) == 4


# ------------------------------------------------------------------ run folders: report folder, progress, resume


def test_new_report_folder_never_reuses_one(tmp_path):
    base = tmp_path / "slca-report"
    assert cli._new_report_folder(base) == base
    base.mkdir()
    assert cli._new_report_folder(base) == tmp_path / "slca-report-2"
    (tmp_path / "slca-report-2").write_text("a file counts too")
    assert cli._new_report_folder(base) == tmp_path / "slca-report-3"


def test_logged_steps_reads_the_newest_step_written_since(tmp_path):
    run = tmp_path / "run"
    assert cli._logged_steps(run, 0.0) == 0  # no folder yet
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 3}\n{"step": 2, "eval/success": 0.1}\n')
    assert cli._logged_steps(run, 0.0) == 3
    assert cli._logged_steps(run, time.time() + 60) == 0  # an older run's file, not yet replaced
    (run / "metrics.jsonl").write_text("not json\n{}\n")
    assert cli._logged_steps(run, 0.0) == 0


def test_resume_command_quotes_the_folder():
    assert cli.resume_command("runs/a") == "slca train --resume runs/a"
    assert cli.resume_command(Path("my runs/it's")) == "slca train --resume 'my runs/it'\"'\"'s'"


def test_interrupted_lines_before_training_and_without_a_checkpoint(tmp_path):
    cfg = TrainConfig(run_dir=str(tmp_path / "run"), steps=5, save_every=0)
    assert cli.interrupted_lines(cfg) == ["interrupted (Ctrl-C) before training started; nothing was written"]
    run = _run(tmp_path / "run", [{"step": 0, "eval/success": 0.1}, {"step": 1, "loss": 0.1}, {"step": 2, "loss": 0.1}])
    (run / "config.json").write_text("{}")
    lines = cli.interrupted_lines(cfg)
    assert lines[0] == f"interrupted (Ctrl-C): 2 of 5 steps done (the last logged in {run / 'metrics.jsonl'})"
    assert lines[1] == "saved: no checkpoint yet (save_every=0); resuming starts again from step 0"
    assert lines[2] == f"resume: slca train --resume {run}"
