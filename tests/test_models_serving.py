"""slca.models.serving: model folders for ``transformers serve`` and the server as a subprocess.

``export_for_serving`` on the session's random tiny policy folder (seconds): what
the folder holds and how its response template reads a generated turn.
``TransformersServer``'s start / stop / failure paths on stand-in server programs
(``sys.executable`` pointed at a script), so no server extra is needed. The real
server end to end: tests/test_serve_real.py (slow).
"""

from __future__ import annotations

import os
import stat
import sys
from types import SimpleNamespace

import pytest
import torch

from slca._fs import umask
from slca.models.default import RESPONSE_TEMPLATE
from slca.models.serving import TEXT_RESPONSE_TEMPLATE, TransformersServer, _merged, export_for_serving

TURN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'


def _parse(tok, text=TURN):
    return tok.parse_response(tok(text, add_special_tokens=False)["input_ids"], prefix="<|im_start|>assistant\n")


def test_export_writes_a_float32_folder_whose_replies_are_plain_text(tiny_model_dir, tmp_path):
    """The default: the whole turn, tool-call markup included, is the reply's content (nothing for the server to
    parse, so nothing to raise on); the weights, config and chat template are the source's; modes follow the umask."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = export_for_serving(str(tiny_model_dir), tmp_path / "served")
    assert out == tmp_path / "served" and (out / "config.json").is_file()
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.response_template == TEXT_RESPONSE_TEMPLATE
    assert tok.chat_template == AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    assert _parse(tok) == {"role": "assistant", "content": TURN.removesuffix("<|im_end|>")}
    src, back = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(out)
    sd = back.state_dict()
    assert all(v.dtype == torch.float32 for v in sd.values())
    assert sd.keys() == src.state_dict().keys() and all(torch.equal(v, sd[k]) for k, v in src.state_dict().items())
    want = 0o666 & ~umask()
    assert all(stat.S_IMODE(p.stat().st_mode) == want for p in out.iterdir() if p.is_file())


def test_export_with_tool_calls_keeps_the_parsing_template_and_takes_another_chat_template(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(export_for_serving(str(tiny_model_dir), tmp_path / "calls", tool_calls=True))
    assert tok.response_template == RESPONSE_TEMPLATE
    assert _parse(tok)["tool_calls"] == [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    inline = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    tok = AutoTokenizer.from_pretrained(export_for_serving(str(tiny_model_dir), tmp_path / "inline", chat_template=inline))
    assert tok.chat_template == inline and tok.response_template == TEXT_RESPONSE_TEMPLATE


def test_export_refuses_a_folder_that_holds_something_before_loading(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="exists and is not empty"):
        export_for_serving(str(tmp_path / "no" / "such" / "model"), tmp_path / "full")  # the model is never looked for
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["config.json"]


def test_merged_folds_adapters_into_the_weights():
    plain = SimpleNamespace()
    assert _merged(plain) is plain
    lora = SimpleNamespace(merge_and_unload=lambda: "merged")
    assert _merged(lora) == "merged"


def _program(tmp_path, body: str):
    """An executable stand-in for ``python -m transformers.cli.transformers serve ...``."""
    path = tmp_path / "fake-python"
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


FAKE_SERVER = """#!{python}
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
print("argv", " ".join(sys.argv[1:]), "offline", os.environ.get("HF_HUB_OFFLINE"), "threads", os.environ.get("OMP_NUM_THREADS"), flush=True)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_the_server_starts_on_loopback_answers_health_and_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", _program(tmp_path, FAKE_SERVER.format(python=sys.executable)))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with TransformersServer(tmp_path / "server.log") as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        assert server.proc.poll() is None and server.cpu_seconds() >= 0.0
    assert server.proc.poll() is not None  # stopped on leaving the block
    log = server.tail()
    assert f"-m transformers.cli.transformers serve --host 127.0.0.1 --port {server.port} --device cpu" in log
    assert "offline 1 threads 1" in log


def test_a_server_that_exits_raises_with_the_end_of_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", _program(tmp_path, "#!/bin/sh\necho 'No module named fastapi'\nexit 3\n"))
    server = TransformersServer(tmp_path / "server.log", start_timeout=60)
    with pytest.raises(RuntimeError, match=r"transformers serve exited with 3: No module named fastapi"):
        server.start()
    assert server._out is None  # the log is closed


def test_a_server_that_never_comes_up_is_stopped_after_the_start_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", _program(tmp_path, "#!/bin/sh\necho loading\nexec sleep 120\n"))
    server = TransformersServer(tmp_path / "server.log", start_timeout=1)
    with pytest.raises(RuntimeError, match=r"transformers serve not up within 1 s: loading"):
        server.start()
    assert server.proc.poll() is not None  # terminated, not left running


def test_tail_of_a_missing_log_is_empty(tmp_path):
    assert TransformersServer(tmp_path / "never-written.log").tail() == ""
    TransformersServer(tmp_path / "x.log").stop()  # stopping a server never started does nothing
    assert not os.path.exists(tmp_path / "x.log")
