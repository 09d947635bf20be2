"""Processes: signals that stop a command as an exception, and child processes that never outlive their parent.

* :func:`signals_raise` (a context manager, main thread): SIGINT (Ctrl-C), SIGTERM (``kill PID``) and SIGHUP (the
  terminal closed) raise :class:`Interrupted` where the main thread is, so the code of every ``finally`` runs
  (children stopped, temporary files removed) and the command says how to continue. A signal that is ignored when
  it starts (``nohup``; SIGINT in a shell's background job) stays ignored. Only the first signal raises: a second
  one while the command stops is ignored, so that the stopping itself is not cut short.
* :class:`Children`: the processes a command starts (``slca demo`` and ``slca compare`` start ``slca train``
  processes); as a context manager every exit path (a signal, a failure, a return) stops those still running:
  SIGTERM, then SIGKILL after ``grace`` seconds. Each child gets ``SLCA_PARENT_PID`` in its environment.
* :func:`watch_parent`: in a child, a thread that sends the process SIGTERM when its parent is gone (a parent killed
  with SIGKILL cannot stop its children itself; the child's own SIGTERM handling then stops it cleanly).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

__all__ = ["Interrupted", "interrupted_by", "signals_raise", "Children", "watch_parent", "PARENT_ENV", "STOP_SIGNALS"]

PARENT_ENV = "SLCA_PARENT_PID"
"""The environment variable :class:`Children` gives each child: the pid of the process that started it."""

STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                     if s is not None)
"""The signals that stop a command: Ctrl-C, ``kill PID``, the terminal closed."""


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived (a :class:`KeyboardInterrupt`, so code that handles Ctrl-C handles every stop signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def what(self) -> str:
        """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``, ``SIGHUP``)."""
        return "Ctrl-C" if self.signum == signal.SIGINT else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal stopped (130, 143, 129)."""
        return 128 + self.signum


def interrupted_by(e: BaseException) -> tuple[str, int]:
    """``(what, exit code)`` of a stop: an :class:`Interrupted`'s, or ``("Ctrl-C", 130)`` for a plain KeyboardInterrupt."""
    return (e.what, e.exit_code) if isinstance(e, Interrupted) else ("Ctrl-C", 130)


@contextlib.contextmanager
def signals_raise(signums: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, each of ``signums`` raises :class:`Interrupted` in the main thread (once; later ones are
    ignored until the block ends, then the previous handlers are back). Outside the main thread it does nothing.
    A signal ignored on entry (``nohup``, a background job) stays ignored; SIGINT is taken over only from Python's
    own Ctrl-C handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if fired:
            return  # already stopping: let the cleanup finish
        fired.append(signum)
        raise Interrupted(signum)

    previous: dict[int, Any] = {}
    for s in signums:
        current = signal.getsignal(s)
        if current == signal.SIG_IGN or (s == signal.SIGINT and current is not signal.default_int_handler):
            continue
        previous[s] = signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Children:
    """The processes a command started; :meth:`stop` (and leaving the ``with`` block, however) stops those still running.

    ``grace``: seconds between SIGTERM (the child stops cleanly, as on Ctrl-C) and SIGKILL.
    """

    def __init__(self, grace: float = 10.0) -> None:
        self.grace = grace
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, label: str, cmd: Sequence[str], *, log: IO[Any], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``cmd`` as ``label``, its stdout and stderr to the open file ``log``."""
        env = dict(os.environ if env is None else env)
        env[PARENT_ENV] = str(os.getpid())
        p = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs[label] = p
        return p

    def running(self) -> list[str]:
        """Labels of the children still running."""
        return [label for label, p in self.procs.items() if p.poll() is None]

    def stop(self, grace: float | None = None) -> list[str]:
        """Stop every child still running: SIGTERM, then SIGKILL for those still there after ``grace`` seconds;
        every child is waited for (no zombie is left). Returns the labels of those that were running."""
        grace = self.grace if grace is None else grace
        alive = {label: p for label, p in self.procs.items() if p.poll() is None}
        for p in alive.values():
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        deadline = time.monotonic() + grace
        for p in alive.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()
        return list(alive)

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def watch_parent(ppid: int, interval: float = 0.5) -> threading.Thread:
    """A daemon thread that sends this process SIGTERM once its parent ``ppid`` is gone (this process was then
    handed to another parent: ``os.getppid()`` changed). Returns the thread, started."""

    def watch() -> None:
        while os.getppid() == ppid:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=watch, name="slca-watch-parent", daemon=True)
    t.start()
    return t


def watch_parent_from_env() -> None:
    """In a child started by :class:`Children`: :func:`watch_parent` of the pid in ``SLCA_PARENT_PID`` (taken out of
    the environment, so that a process this one starts does not watch its grandparent). Nothing when it is not set."""
    value = os.environ.pop(PARENT_ENV, None)
    if value and value.isdigit():
        watch_parent(int(value))
