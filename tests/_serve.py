"""``transformers serve`` on loopback for the tests (a real OpenAI-compatible server in a subprocess)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TransformersServer:
    """``transformers serve --host 127.0.0.1 --port P --device cpu`` in a subprocess, one torch thread, offline.

    No model is pinned: each request names a model folder, which the server loads on first use. ``log`` is the
    server's stdout and stderr; :meth:`start` waits for ``/health`` (at most ``start_timeout`` seconds) and says
    what the log holds when the server does not come up.
    """

    def __init__(self, log: Path, *, start_timeout: float = 600.0):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log, self.start_timeout = Path(log), start_timeout
        self.proc: subprocess.Popen | None = None

    def start(self) -> "TransformersServer":
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--device", "cpu", "--log-level", "warning"]
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
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
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the server process has used so far (Linux)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if getattr(self, "_out", None) is not None:
            self._out.close()
