import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import slca
from slca.reporting.report import _series, metric_range, provenance, run_labels, smoothed, write_report, write_token_html

ROOT = Path(__file__).resolve().parents[1]


def _sample():
    toks = ["<tool_call>", "{\"name\"", "}", "</tool_call>", "<|im_end|>", "\n<|im_start|>user", "{\"t\": 3}", "It", " is", " 3", "<|im_end|>"]
    mm = [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1]
    tm = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    sm = [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    rows = []
    for tr, sr, g, s in ((0.2, 1.0, -0.1, -1.0), (1.0, 0.1, 0.1, 1.0)):
        rows.append({
            "tokens": toks, "model_mask": mm, "tool_mask": tm, "summary_mask": sm,
            "adv": {"grpo": [g if m else 0.0 for m in mm], "slca": [(s if t else -s) if m else 0.0 for m, t in zip(mm, tm)]},
            "tool_reward": tr, "summary_reward": sr, "stop_reason": "final_answer",
        })
    return [{"step": 0, "task": "t1", "kind": "parallel", "prompt": "<|im_start|>user\nweather?", "rollouts": rows}]


def _metrics(run, vals, config=None, first_step=1):
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for i, v in enumerate(vals):
            f.write(json.dumps({"step": i + first_step, "reward/tool": v, "reward/summary": 1 - v, "adv/contamination": 0.3, "grad/cosine_tool_summary": 0.01,
                                "eval/success": v, "eval/name_f1": v, "eval/arg_match": v, "eval/process": v, "eval/reward_summary": v}) + "\n")
    if config is not None:
        (run / "config.json").write_text(json.dumps(config))


def test_write_report(tmp_path):
    _metrics(tmp_path / "a", [0.1, 0.2, 0.3], {"estimator": "grpo", "lr": 1e-4, "seed": 0})
    _metrics(tmp_path / "b", [0.2, 0.4, 0.6], {"estimator": "slca", "lr": 5e-4, "seed": 0})
    md = write_report({"GRPO": tmp_path / "a", "SLCA": tmp_path / "b"}, tmp_path / "out")
    text = md.read_text()
    assert "| GRPO | 0.300" in text and "| SLCA | 0.600" in text
    assert (tmp_path / "out" / "curves.png").stat().st_size > 10_000
    # the config is recorded: the fields that differ first, then every field of each run
    assert "| lr | 0.0001 | 0.0005 |" in text and "| estimator | \"grpo\" | \"slca\" |" in text
    assert "| seed |" not in text  # same in both runs: only in the full listings
    assert text.count('"seed": 0') == 2
    # with the slca version and the commit of the code that wrote it
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert f"slca {slca.__version__}, commit `{head}" in text
    assert "5-step trailing mean" in text


def test_report_says_when_a_run_has_no_config(tmp_path):
    _metrics(tmp_path / "a", [0.1])
    text = write_report({"a": tmp_path / "a"}, tmp_path / "out").read_text()
    assert "No config.json in the run folder of: a." in text


def test_provenance_outside_a_git_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "not-a-repo"))
    assert provenance() == {"slca_version": slca.__version__, "git_commit": "unknown (not a git checkout)"}


def test_steps_come_from_the_data():
    rows = [{"step": s, "reward/tool": 0.5} for s in (1, 2, 5)]
    assert _series(rows, "reward/tool")[0] == [1, 2, 5]
    assert _series([{"step": 0, "reward/tool": 0.5}], "reward/tool")[0] == [0]


def test_smoothing_and_ranges():
    assert smoothed("reward/tool") and smoothed("grad/norm") and not smoothed("eval/success") and not smoothed("grad/volatility")
    assert metric_range("eval/success") == (0.0, 1.0) and metric_range("grad/cosine_tool_summary") == (-1.0, 1.0)
    assert metric_range("grad/volatility")[0] == 0.0 and metric_range("probe/parallel_pref") == (float("-inf"), float("inf"))


def test_run_labels_unique():
    labels = run_labels(["/r/x/seed0", "/r/y/seed0", "/r/z/other"])
    assert list(labels) == ["x/seed0", "y/seed0", "other"]
    assert list(run_labels(["/r/a", "/r/a"])) == ["a", "a #2"]
    assert list(run_labels(["/r/a/b/run", "/r/c/b/run"])) == ["a/b/run", "c/b/run"]


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "slca.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_report_cli_labels_colliding_folders_and_prints_whole_table(tmp_path):
    _metrics(tmp_path / "x" / "run", [0.1, 0.2, 0.3], {"lr": 1e-4})
    _metrics(tmp_path / "y" / "run", [0.2, 0.4, 0.6], {"lr": 5e-4})
    r = _cli("report", str(tmp_path / "x" / "run"), str(tmp_path / "y" / "run"), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| x/run | 0.300" in text and "| y/run | 0.600" in text  # neither run dropped
    # stdout is a pipe here (as in logs and CI): the table is not cut at 80 columns
    assert "…" not in r.stdout
    for word in ("estimator", "arg_match", "summary reward", "parallel split", "contamination", "grad cos", "x/run", "y/run"):
        assert word in r.stdout, r.stdout
    assert max(len(ln) for ln in r.stdout.splitlines()) > 80


def test_report_rejects_non_run_folder(tmp_path):
    with pytest.raises(ValueError, match="metrics.jsonl"):
        write_report({"x": tmp_path}, tmp_path / "out")


def test_token_html_structure(tmp_path):
    p = write_token_html(_sample(), tmp_path / "t.html")
    html = p.read_text()
    assert html.count('data-estimator="grpo"') == 2 and html.count('data-estimator="slca"') == 2
    assert 'class="tok env"' in html and 'class="tok tool"' in html and 'class="tok summ"' in html
    assert "&lt;tool_call&gt;" in html  # tokens are escaped


def test_token_html_shows_advantages_inline(tmp_path):
    html = write_token_html(_sample(), tmp_path / "t.html").read_text()
    # one box per run of tokens with one advantage: GRPO one per segment (same value), SLCA one per segment (own values)
    assert html.count('<span class="adv" data-adv="-0.100">A=-0.100</span>') == 2  # rollout 0 under GRPO: tool and summary runs
    assert html.count('<span class="adv" data-adv="-1.000">A=-1.000</span>') == 2  # SLCA: rollout 0 tool, rollout 1 summary
    assert html.count('<span class="adv" data-adv="+1.000">A=+1.000</span>') == 2
    assert "slca: execution A -1.000 &middot; summary A +1.000" in html
    assert "grpo: execution A +0.100 &middot; summary A +0.100" in html


HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'"


def _crafted_run(run):
    _metrics(run, [0.1, 0.2])
    s = _sample()
    g = s[0]
    g.update(step=HOSTILE, task=HOSTILE, kind=HOSTILE, prompt=HOSTILE)
    for r in g["rollouts"]:
        r["stop_reason"] = HOSTILE
        r["tool_reward"] = HOSTILE
        r["tokens"] = [HOSTILE if i == 0 else t for i, t in enumerate(r["tokens"])]
    (run / "samples.json").write_text(json.dumps(s))


def test_report_escapes_every_field_of_a_crafted_run_folder(tmp_path):
    run = tmp_path / "crafted"
    _crafted_run(run)
    r = _cli("report", str(run))
    assert r.returncode == 0, r.stdout + r.stderr
    html = (run / "tokens.html").read_text()
    assert "<script" not in html and "<img" not in html and "onerror=alert(2)>" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 6  # step, task, kind, prompt, stop_reason, reward, tokens
    assert html.count("<span") > 0 and html.count("<h2") == 1


def test_report_refuses_malformed_samples_naming_the_field(tmp_path):
    run = tmp_path / "bad"
    _metrics(run, [0.1])
    s = _sample()
    s[0]["rollouts"][1]["adv"]["slca"][3] = "<b>"
    (run / "samples.json").write_text(json.dumps(s))
    r = _cli("report", str(run))
    assert r.returncode == 2 and r.stderr.startswith("error: ")
    assert "group 0 rollout 1: field 'adv.slca' must be a list of finite numbers" in r.stderr
    (run / "samples.json").write_text("[{")
    r = _cli("report", str(run))
    assert r.returncode == 2 and "samples.json is not valid JSON" in r.stderr


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.browser
def test_token_html_renders_in_headless_browser(tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.importorskip("chromium_binary_not_found", reason="could not import: no chromium on PATH")
    p = write_token_html(_sample(), tmp_path / "t.html")
    png = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'prof'}", "--window-size=1400,900"]
    subprocess.run([exe, *flags, f"--screenshot={png}", p.as_uri()], check=True, capture_output=True, timeout=120)
    from PIL import Image

    img = Image.open(png).convert("RGB")
    px = list(img.get_flattened_data()) if hasattr(img, "get_flattened_data") else list(img.getdata())
    green = sum(1 for r, g, b in px if g > r + 40 and g > b + 20)
    red = sum(1 for r, g, b in px if r > g + 60 and r > b + 60)
    grey = sum(1 for r, g, b in px if abs(r - 229) < 4 and abs(g - 231) < 4 and abs(b - 235) < 4)
    # advantage colours and the grey environment tokens actually rendered
    assert green > 200 and red > 200 and grey > 100
    dom = subprocess.run([exe, *flags, "--dump-dom", p.as_uri()], check=True, capture_output=True, text=True, timeout=120).stdout
    assert dom.count("data-estimator=\"slca\"") == 2
    assert dom.count('class="adv"') == 8 and "A=+1.000" in dom  # the numbers are on the page, not only in tooltips


def test_report_writes_only_into_a_run_a_report_or_a_new_folder(tmp_path):
    from typer.testing import CliRunner

    from slca.cli import app

    runs = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/tool": 0.5}) + "\n")
        runs.append(str(d))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my own report")
    r = CliRunner().invoke(app, ["report", *runs, "--out", str(mine)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: --out: '{mine}' is neither a run folder nor a report slca wrote"), r.output
    assert (mine / "report.md").read_text() == "my own report"
    out = tmp_path / "cmp"
    assert CliRunner().invoke(app, ["report", *runs, "--out", str(out)]).exit_code == 0
    assert CliRunner().invoke(app, ["report", *runs, "--out", str(out)]).exit_code == 0  # its own report: written again
