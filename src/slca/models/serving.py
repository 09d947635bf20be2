"""Model folders for an OpenAI-compatible server: ``slca export-model``.

``transformers serve`` (transformers' own FastAPI server: ``/v1/chat/completions``,
``/v1/models``, ``/health``) serves any ``save_pretrained`` folder; slca's LLM-backed
parts talk to it as to vLLM: :class:`slca.env.LLMSimulator`, :class:`slca.rewards.OpenAIJudge`
and tau2's user simulator (``slca eval --suite tau2 --user-url``). See docs/environment.md.

How the server turns a generated turn into a message is the tokenizer's
``response_template`` (or, without one, a fallback transformers keeps for Qwen
models). A template that parses ``<tool_call>`` blocks as JSON makes the server
answer **HTTP 500** when the model writes a malformed call (the parser raises), and a
malformed call from a small model is ordinary output, not a server fault. So
:func:`export_for_serving` writes the folder with :data:`TEXT_RESPONSE_TEMPLATE` by
default: the whole turn comes back as ``content``, tool-call markup included, and
slca's callers parse what they need themselves (:mod:`slca.chat.formats` never
raises). ``tool_calls=True`` keeps the parsing template (OpenAI ``tool_calls`` in the
reply, for a client that needs them, such as tau2's telecom user tools) and with it
the 500s, which slca's clients count and report as endpoint faults.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from slca._fs import umask_modes
from slca.models.default import RESPONSE_TEMPLATE
from slca.models.loading import load_policy

__all__ = ["TEXT_RESPONSE_TEMPLATE", "export_for_serving", "TransformersServer"]

TEXT_RESPONSE_TEMPLATE: dict = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {"content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"}},
}
"""A ChatML turn read as plain text: everything up to ``<|im_end|>`` is the message content (a turn
with ``<tool_call>`` blocks included), so no model output can make the server's parser raise."""


def _merged(model: Any) -> Any:
    """A LoRA-wrapped model with its adapters merged into the weights (a plain model as it is)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def export_for_serving(spec: str, out: str | Path, *, tool_calls: bool = False, chat_template: str = "") -> Path:
    """Write ``spec`` (a named model such as ``smollm2`` or ``default``, a model folder, a LoRA checkpoint or a
    hub id) as a ``save_pretrained`` folder ``out`` for ``transformers serve``, float32.

    The folder holds the model's chat template (``chat_template``: a .jinja path or inline text to use another) and
    :data:`TEXT_RESPONSE_TEMPLATE`, or, with ``tool_calls=True``, the template that parses ``<tool_call>`` blocks
    into OpenAI ``tool_calls`` (:data:`slca.models.default.RESPONSE_TEMPLATE`). ``out`` must not hold a model yet.
    """
    out = Path(out).expanduser()
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {str(out)!r} exists and is not empty; export-model writes a new or empty folder: choose another --out")
    model, tok = load_policy(spec, chat_template=chat_template, template_fix="set chat_template (a .jinja file or inline)")
    model = _merged(model)
    tok.response_template = copy.deepcopy(RESPONSE_TEMPLATE if tool_calls else TEXT_RESPONSE_TEMPLATE)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    umask_modes(out)
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TransformersServer:
    """``transformers serve`` on loopback in a subprocess: one torch thread, offline, CPU; a context manager.

    No model is pinned: each request names a model folder (written by :func:`export_for_serving`), which the
    server loads on first use. ``base_url`` is the ``/v1`` root for :class:`slca.env.LLMSimulator`,
    :class:`slca.rewards.OpenAIJudge` or tau2's user simulator. :meth:`start` waits for ``/health`` (at most
    ``start_timeout`` seconds) and, when the server does not come up, raises with the end of its log (``log``:
    its stdout and stderr). Needs the ``serve`` extra (fastapi, uvicorn, openai)::

        with TransformersServer("server.log") as server:
            sim = LLMSimulator(tools, base_url=server.base_url, model=str(folder), max_tokens=64)
    """

    def __init__(self, log: str | Path, *, port: int | None = None, start_timeout: float = 600.0, device: str = "cpu"):
        self.port = port or _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log, self.start_timeout, self.device = Path(log), float(start_timeout), device
        self.proc: subprocess.Popen | None = None
        self._out = None

    def start(self) -> "TransformersServer":
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
               "HF_HUB_DISABLE_UPDATE_CHECK": "1", "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--device", self.device, "--log-level", "warning"]
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"transformers serve exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"transformers serve not up within {self.start_timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of the server's log."""
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the server process has used so far (Linux ``/proc``)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """Terminate the server (kill it after 30 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self._out is not None:
            self._out.close()
            self._out = None

    def __enter__(self) -> "TransformersServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
