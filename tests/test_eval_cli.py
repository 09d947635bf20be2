"""End to end: ``slca eval`` of the embedded model recipe (built at a tiny size)
on a handful of records of every suite, and its errors for bad arguments."""

from __future__ import annotations

import json
import pathlib

import pytest
from typer.testing import CliRunner

from slca.cli import app

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """The embedded model's build pipeline (toolworld demos, tokenizer, SFT warm start) at a tiny size."""
    from recipes.warmstart import BuildConfig, ModelSize, SFTConfig
    from slca.models import default_model_dir, load_default

    cfg = BuildConfig(
        n_tasks=80,
        vocab_size=400,
        model=ModelSize(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64),
        sft=SFTConfig(steps=25, batch_tokens=4096, lr=1e-2, warmup_steps=3),
    )
    root = tmp_path_factory.mktemp("model")
    load_default(root, config=cfg, progress=False)
    return str(default_model_dir(root, cfg))


def _eval(args: list[str], out: pathlib.Path) -> dict:
    res = runner.invoke(app, ["eval", *args, "--out", str(out), "--max-new-tokens", "24"])
    assert res.exit_code == 0, res.output
    suite = args[args.index("--suite") + 1]
    md = (out / f"{suite}.md").read_text()
    assert md.startswith(f"# slca eval: {suite}")
    printed = res.output.splitlines()
    assert all(line in printed for line in md.splitlines()), res.output  # printed whole: no line wrapped at 80 columns
    return json.loads((out / f"{suite}.json").read_text())


@pytest.mark.slow
def test_eval_toolworld(tiny_model, tmp_path):
    rep = _eval(["--model", tiny_model, "--suite", "toolworld", "--limit", "6", "--samples", "2"], tmp_path)
    assert set(rep["metrics"]) == {"name_f1", "arg_match", "process", "success", "paper_success", "pass^2"}
    assert len(rep["records"]) == 12 and rep["samples"] == 2
    assert sum(rep["counts"].values()) == 6  # per task kind
    assert all(0 <= v <= 1 for v in rep["metrics"].values())
    from slca.models.named import model_fingerprint

    fp = model_fingerprint(tiny_model)  # the records name the weights they measured
    assert rep["config"]["model_fingerprint"] == fp and fp.startswith("sha256:")
    assert f"(`{fp}`)" in (tmp_path / "toolworld.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("source", ["file", "save_to_disk folder"])
def test_eval_toucan_rows(tiny_model, tmp_path, source):
    data = FIXTURES / "env" / "toucan_small.jsonl"
    if source != "file":  # evaluation.md: --data takes any source load_tasks reads
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_json(str(data)).save_to_disk(str(tmp_path / "rows"))
        data = tmp_path / "rows"
    rep = _eval(["--model", tiny_model, "--suite", "toucan", "--data", str(data), "--limit", "3"], tmp_path)
    assert len(rep["records"]) == 3
    assert set(rep["metrics"]) == {"name_f1", "arg_match", "process", "success", "paper_success"}


@pytest.mark.slow
def test_eval_bfcl(tiny_model, tmp_path):
    pytest.importorskip("bfcl_eval")
    rep = _eval(["--model", tiny_model, "--suite", "bfcl", "--categories", "simple,parallel,irrelevance,live_simple,multi_turn_miss_func", "--limit", "2"], tmp_path)
    assert rep["counts"] == {"irrelevance": 2, "live_simple": 2, "multi_turn_miss_func": 2, "parallel": 2, "simple_python": 2, "simple_java": 2, "simple_javascript": 2}
    assert {"simple_ast", "non_live_ast", "live_ast", "multi_turn", "irrelevance", "overall", "truncated_records"} <= set(rep["metrics"])
    assert rep["metrics"]["truncated_records"] == sum(1 for r in rep["records"] if r["detail"]["truncated_turns"])
    assert all(r["scores"]["accuracy"] in (0.0, 1.0) for r in rep["records"])


@pytest.mark.slow
def test_eval_tau2_scripted_user(tiny_model, tmp_path):
    pytest.importorskip("tau2")
    rep = _eval(["--model", tiny_model, "--suite", "tau2", "--user", "scripted", "--limit", "1", "--samples", "2", "--max-steps", "8"], tmp_path)
    assert rep["counts"] == {"airline": 1, "retail": 1}
    assert {"avg_reward", "pass^1", "pass^2"} <= set(rep["metrics"])
    assert rep["metrics"]["pass^2"] <= rep["metrics"]["pass^1"]
    assert len(rep["records"]) == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "/no/such/model", "--suite", "toolworld"], "no such folder"),
        (["--model", "{model}", "--suite", "nope"], "choose from"),
        (["--model", "{model}", "--suite", "bfcl", "--categories", "simple,bogus"], "unknown BFCL category 'bogus'"),
        (["--model", "{model}", "--suite", "tau2", "--categories", "telecom"], "tau2 domains are"),
        (["--model", "{model}", "--suite", "tau2"], "--user-url"),
        (["--model", "{model}", "--suite", "toucan"], "--data"),
        (["--model", "{model}", "--suite", "toolworld", "--categories", "weird"], "task kinds here are"),
        (["--model", "{model}", "--suite", "toolworld", "--format", "nonsense"], "nonsense"),
        (["--model", "{model}", "--suite", "toolworld", "--split", "valid"], "toolworld splits are"),
        (["--model", "{model}", "--suite", "toucan", "--split", "train_heldout"], "--split is for --suite toolworld"),
        (["--model", "{model}", "--suite", "tau2", "--user", "scripted", "--user-max-tokens", "0"], "--user-max-tokens"),
    ],
)
def test_eval_bad_arguments(args, message, tiny_model, tmp_path):
    res = runner.invoke(app, ["eval", *[a.replace("{model}", tiny_model) for a in args], "--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())


def test_eval_folder_without_config(tmp_path):
    res = runner.invoke(app, ["eval", "--model", str(tmp_path), "--suite", "toolworld"])
    assert res.exit_code == 2 and "no config.json" in res.output


def test_eval_never_replaces_a_file_it_did_not_write(tmp_path):
    (tmp_path / "toolworld.json").write_text('{"mine": true}')
    (tmp_path / "bfcl.md").write_text("# my notes on BFCL")
    for suite, name in (("toolworld", "toolworld.json"), ("bfcl", "bfcl.md")):
        res = runner.invoke(app, ["eval", "--model", "default", "--suite", suite, "--out", str(tmp_path)])
        assert res.exit_code == 2, res.output
        assert res.stderr == (f"error: --out: '{tmp_path / name}' is not a report of slca eval; slca eval would replace it: "
                              "choose another --out\n")
    assert (tmp_path / "toolworld.json").read_text() == '{"mine": true}' and (tmp_path / "bfcl.md").read_text() == "# my notes on BFCL"
