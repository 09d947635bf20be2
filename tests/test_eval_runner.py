"""slca.eval.runner: ``slca eval``'s config checks, suite preparation and one run (the command line: test_eval_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slca.eval import runner
from slca.eval.agent import GenerationConfig
from slca.eval.runner import SUITES, EvalConfig, load_model, run_eval

FIX = Path(__file__).parent / "fixtures" / "env"


@pytest.fixture()
def no_model(monkeypatch):
    """``load_model`` that fails the test: what is refused must be refused before any model loads."""

    def refuse(spec):
        raise AssertionError(f"the model {spec!r} was loaded before the arguments were checked")

    monkeypatch.setattr(runner, "load_model", refuse)


def test_suites():
    assert SUITES == ("toolworld", "toucan", "bfcl", "tau2")


@pytest.mark.parametrize("kw,message", [
    (dict(suite="nope"), "--suite 'nope': choose from ['toolworld', 'toucan', 'bfcl', 'tau2']"),
    (dict(samples=0), "--samples must be >= 1, got 0"),
    (dict(limit=0), "--limit must be >= 1, got 0"),
    (dict(split="valid"), "--split 'valid': toolworld splits are"),
    (dict(suite="bfcl", split="train_heldout"), "--split is for --suite toolworld, not bfcl"),
    (dict(suite="toucan"), "--suite toucan needs --data PATH"),
    (dict(format="xml"), "unknown tool-call format 'xml'"),
    (dict(categories=["weird"]), "--categories ['weird']: task kinds here are"),
    (dict(suite="bfcl", categories=["simple", "bogus"]), "unknown BFCL category 'bogus'"),
    (dict(suite="tau2", categories=["telecom"]), "--categories ['telecom']: tau2 domains are"),
    (dict(suite="tau2"), "--suite tau2 needs --user-url and --user-model"),
    (dict(suite="tau2", user_base_url="http://127.0.0.1:1/v1"), "--suite tau2 needs --user-url and --user-model"),
    (dict(suite="toucan", data="/no/such/rows.jsonl"), "/no/such/rows.jsonl"),
])
def test_every_argument_is_refused_before_the_model_loads(no_model, kw, message):
    with pytest.raises(ValueError) as e:
        run_eval(EvalConfig(**{"model": "default", "suite": "toolworld", **kw}))
    assert message in str(e.value), str(e.value)


def test_in_domain_tasks_keep_the_asked_kinds_and_the_limit():
    run = runner._in_domain(EvalConfig(model="m", suite="toolworld", categories=["single", "chain"], limit=5, samples=2, max_turns=3))
    kw = run.keywords
    assert len(kw["tasks"]) == 5 and {t.kind for t in kw["tasks"]} <= {"single", "chain"}
    assert all(t.meta["split"] == "test" for t in kw["tasks"])  # --split test by default
    assert (kw["suite"], kw["samples"], kw["max_turns"], kw["model_label"]) == ("toolworld", 2, 3, "m")
    every = runner._in_domain(EvalConfig(model="m", suite="toolworld")).keywords["tasks"]
    assert len(every) > 5 and {"single", "chain"} < {t.kind for t in every}  # no --categories, no --limit: all of them


def test_a_toucan_data_file_is_the_suites_tasks():
    run = runner._in_domain(EvalConfig(model="m", suite="toucan", data=str(FIX / "verl_small.jsonl"), limit=2))
    assert [t.id for t in run.keywords["tasks"]] == ["0", "1"] and run.keywords["suite"] == "toucan"


def test_bfcl_and_tau2_runs_take_the_resolved_arguments():
    pytest.importorskip("bfcl_eval")  # each suite imports its package before the model loads
    pytest.importorskip("tau2")
    bfcl = runner._bfcl(EvalConfig(model="m", suite="bfcl", categories=["simple"], limit=2, samples=3)).keywords
    assert bfcl["categories"] == ["simple_python", "simple_java", "simple_javascript"]
    assert (bfcl["limit"], bfcl["samples"], bfcl["model_label"]) == (2, 3, "m")
    tau2 = runner._tau2(EvalConfig(model="m", suite="tau2", user="scripted", categories=["retail"], max_steps=9)).keywords
    assert (tau2["domains"], tau2["user"], tau2["max_steps"]) == (["retail"], "scripted", 9)
    assert runner._tau2(EvalConfig(model="m", suite="tau2", user="scripted")).keywords["domains"] is None  # every domain


def test_load_model_refuses_naming_the_option():
    with pytest.raises(ValueError, match=r"^--model '/no/such/model': no such folder"):
        load_model("/no/such/model")


def test_load_model_gives_the_model_in_eval_mode(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    assert not model.training and tok.chat_template


def test_run_eval_saves_the_report_and_records_its_settings(tiny_model_dir, tmp_path):
    cfg = EvalConfig(model=str(tiny_model_dir), suite="toolworld", limit=2, max_turns=1, progress=False,
                     gen=GenerationConfig(max_new_tokens=4))
    rep = run_eval(cfg, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "toolworld.json").read_text())
    assert (tmp_path / "out" / "toolworld.md").read_text().startswith("# slca eval: toolworld")
    assert len(saved["records"]) == len(rep.records) == 2
    c = saved["config"]
    assert (c["split"], c["max_new_tokens"], c["temperature"]) == ("test", 4, 0.0)
    assert isinstance(c["generated_tokens"], int) and 0 <= c["generated_tokens"] <= 2 * 4  # one turn of at most 4 tokens a task
    assert all(isinstance(c[k], float) and c[k] >= 0 for k in ("seconds", "cpu_seconds"))  # its cost, beside what it measured
    assert f"{c['cpu_seconds']:,.0f} CPU s" in (tmp_path / "out" / "toolworld.md").read_text()
    assert set(saved["metrics"]) >= {"name_f1", "arg_match", "process", "success"}
    assert all(0 <= v <= 1 for v in saved["metrics"].values())


def test_a_bfcl_evaluation_stopped_part_way_resumes_at_its_first_unfinished_category(tiny_model_dir, tmp_path, monkeypatch):
    """Each finished category is kept under --out until the report is written; the same command again reads it back
    and runs only the rest, with the same report as an uninterrupted run; other settings run everything again."""
    pytest.importorskip("bfcl_eval")
    import slca.eval.bfcl as bfcl_mod

    cfg = EvalConfig(model=str(tiny_model_dir), suite="bfcl", categories=["simple_python", "parallel"], limit=2, progress=False,
                     gen=GenerationConfig(max_new_tokens=6))
    run_eval(cfg, tmp_path / "whole")
    assert not (tmp_path / "whole" / runner.PARTIAL).exists()  # cleared once the report is written

    real_drive, driven = bfcl_mod.drive, []

    def drive(agent, eps, *, desc, progress):
        driven.append(desc)
        if desc == "bfcl parallel" and len(driven) == 2:
            raise KeyboardInterrupt  # stopped in the second category
        return real_drive(agent, eps, desc=desc, progress=progress)

    monkeypatch.setattr(bfcl_mod, "drive", drive)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_eval(cfg, out)
    assert [p.name for p in (out / runner.PARTIAL).iterdir()] == ["simple_python.json"] and not (out / "bfcl.json").exists()
    rep = run_eval(cfg, out)
    assert driven == ["bfcl simple_python", "bfcl parallel", "bfcl parallel"]  # simple_python was not run again
    assert not (out / runner.PARTIAL).exists()
    saved, ref = json.loads((out / "bfcl.json").read_text()), json.loads((tmp_path / "whole" / "bfcl.json").read_text())
    assert saved["records"] == ref["records"] and saved["metrics"] == ref["metrics"]
    assert saved["config"]["generated_tokens"] == ref["config"]["generated_tokens"]
    assert any(n.startswith("resumed: simple_python read back from") for n in rep.notes)
    assert "seconds and cpu_seconds count this run only, not the parts read back" in rep.notes

    # a kept category of other settings (here max_new_tokens) runs again; so does a file cut short
    driven.clear()
    with pytest.raises(KeyboardInterrupt):
        run_eval(cfg, out)
    (out / runner.PARTIAL / "parallel.json").write_text('{"key": ')
    other = EvalConfig(**{**cfg.__dict__, "gen": GenerationConfig(max_new_tokens=5)})
    run_eval(other, out)
    assert driven == ["bfcl simple_python", "bfcl parallel", "bfcl simple_python", "bfcl parallel"]


def test_partial_records_read_back_only_under_their_key(tmp_path):
    from slca.eval.report import PartialRecords, Record

    recs = [Record(id="a", group="g", sample=0, scores={"accuracy": 1.0, "x": float("nan")}, detail={"truncated_turns": 0})]
    PartialRecords(tmp_path / "p", {"m": "sha256:1", "n": 2}).save("cat", recs, 7)
    back = PartialRecords(tmp_path / "p", {"m": "sha256:1", "n": 2})
    got, toks = back.load("cat")
    assert toks == 7 and got[0].id == "a" and got[0].scores["accuracy"] == 1.0 and back.resumed == ["cat"]
    assert PartialRecords(tmp_path / "p", {"m": "sha256:2", "n": 2}).load("cat") is None  # other weights
    assert back.load("other") is None
    (tmp_path / "p" / "cat.json").write_text("[1, 2]")  # not ours
    assert back.load("cat") is None
    (tmp_path / "p" / "notes.txt").write_text("a file of the user's")
    back.clear()  # removes only the parts it read or wrote
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["notes.txt"]
    (tmp_path / "p" / "notes.txt").unlink()
    PartialRecords(tmp_path / "p", {}).clear()  # nothing of its own: the empty folder goes
    assert not (tmp_path / "p").exists()
