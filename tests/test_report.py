import json
import shutil
import subprocess

import pytest

from slca.report import write_report, write_token_html


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


def _metrics(run, vals):
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for i, v in enumerate(vals):
            f.write(json.dumps({"step": i, "reward/tool": v, "reward/summary": 1 - v, "adv/contamination": 0.3, "grad/cosine_tool_summary": 0.01, "eval/success": v}) + "\n")


def test_write_report(tmp_path):
    _metrics(tmp_path / "a", [0.1, 0.2, 0.3])
    _metrics(tmp_path / "b", [0.2, 0.4, 0.6])
    md = write_report({"GRPO": tmp_path / "a", "SLCA": tmp_path / "b"}, tmp_path / "out")
    text = md.read_text()
    assert "| GRPO | 0.300" in text and "| SLCA | 0.600" in text
    assert (tmp_path / "out" / "curves.png").stat().st_size > 10_000


def test_report_rejects_non_run_folder(tmp_path):
    with pytest.raises(ValueError, match="metrics.jsonl"):
        write_report({"x": tmp_path}, tmp_path / "out")


def test_token_html_structure(tmp_path):
    p = write_token_html(_sample(), tmp_path / "t.html")
    html = p.read_text()
    assert html.count("data-estimator='grpo'") == 2 and html.count("data-estimator='slca'") == 2
    assert "class='tok env'" in html and "class='tok tool'" in html and "class='tok summ'" in html
    assert "&lt;tool_call&gt;" in html  # tokens are escaped


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
