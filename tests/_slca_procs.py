"""Real ``slca`` processes in tests: start one, find the processes it started, signal them, wait, and clean up.

Every process a test starts goes through :class:`Started` (a context manager): on the way out it kills the
process and every child it was seen with that is still there, so a failing test leaves nothing running.
Linux only (children are read from ``/proc``); :data:`HAS_PROC` says whether this machine has it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false")
HAS_PROC = Path("/proc/self/task").is_dir()
SLCA = [sys.executable, "-m", "slca.cli"]


def sets(*items: str) -> list[str]:
    return [x for s in items for x in ("--set", s)]


def sigint_default() -> None:
    """``preexec_fn``: SIGINT and SIGHUP at their defaults in the child, as a user's terminal leaves them. A shell that
    starts pytest in the background without job control leaves SIGINT ignored, and ``nohup`` leaves SIGHUP ignored; the
    child would inherit that, and slca keeps a signal ignored at its start ignored (tests/test_procs.py). :class:`Started`
    applies it unless given another ``preexec_fn``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def children(pid: int) -> list[int]:
    """The processes ``pid`` started that are still its children."""
    out: list[int] = []
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out += [int(x) for x in f.read_text().split()]
    return sorted(set(out))


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot; None if there is no such process): with the pid, a process's identity."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie, ended but not yet waited for, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_until(cond: Callable[[], bool], timeout: float, what: str, proc: subprocess.Popen | None = None) -> float:
    """Poll ``cond`` every 0.1 s until it holds; returns the seconds it took. Fails after ``timeout`` seconds (or when
    ``proc`` ended first) naming ``what``."""
    t0 = time.monotonic()
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended first (exit {proc.returncode})")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - t0


class Started:
    """``subprocess.Popen(cmd)`` (stdout and stderr to files under ``logs``) as a context manager that kills, on the way
    out, the process and every child :meth:`kids` saw that is still there."""

    def __init__(self, cmd: list[str], logs: Path, *, env: dict | None = None, cwd: Path | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = logs / "stdout", logs / "stderr"
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        self.p = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, env=env or ENV, cwd=cwd,
                                  preexec_fn=preexec_fn or sigint_default)
        self.seen: dict[int, int | None] = {}  # pid -> start time

    def kids(self) -> list[int]:
        now = children(self.p.pid)
        for pid in now:
            self.seen.setdefault(pid, start_time(pid))
        return now

    def wait_for_kids(self, n: int, timeout: float = 120) -> list[int]:
        wait_until(lambda: len(self.kids()) >= n, timeout, f"{n} child processes", self.p)
        return self.kids()

    def wait(self, timeout: float) -> int:
        return self.p.wait(timeout=timeout)

    @property
    def stdout(self) -> str:
        self._out.flush()
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        self._err.flush()
        return self.err_path.read_text(errors="replace")

    def __enter__(self) -> "Started":
        return self

    def __exit__(self, *exc) -> None:
        if self.p.poll() is None:
            self.p.kill()
        for pid, started in self.seen.items():
            if alive(pid) and started is not None and start_time(pid) == started:  # the same process, not a reused pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(timeout=30)
        self._out.close()
        self._err.close()


def in_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``slca <args>`` run in this process (typer's test runner, through the command line's own one-line error handling),
    as a :class:`subprocess.CompletedProcess`: for refusals and usage errors, where the process is not what is under
    test. No torch or task generation is paid again, so it costs milliseconds where a process costs seconds.
    ``cwd``: the folder relative paths are read from (changed for the call, then restored)."""
    from typer.testing import CliRunner

    from slca.cli import app

    here = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        r = CliRunner().invoke(app, list(args))
    finally:
        os.chdir(here)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(["slca", *args], r.exit_code, r.stdout, r.stderr)
