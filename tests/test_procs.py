"""slca._procs on real processes and real signals: a stop signal as an exception, children stopped with their parent
(on a signal, on an error, and when the parent is killed outright). The commands that use it: test_demo_cli.py,
test_compare.py (slca demo and slca compare), test_unattended.py (slca train)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from _slca_procs import ENV, HAS_PROC, Started, alive, sigint_default, wait_until
from slca._procs import Children, Interrupted, interrupted_by

pytestmark = pytest.mark.skipif(not HAS_PROC, reason="reads child processes from /proc (Linux)")

# a command that starts two sleeping children and waits: its stdout says when it is ready
PARENT = textwrap.dedent("""
    import sys, time
    from slca._procs import Children, interrupted_by, signals_raise
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    try:
        with signals_raise(), Children(grace=float(sys.argv[1])) as kids:
            for i in range(2):
                kids.start(f"s{i}", sleeper if sys.argv[2] == "plain" else
                           [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                            "print('ignoring', file=sys.stderr, flush=True); time.sleep(120)"],
                           log=sys.stderr)
            print("ready", flush=True)
            if sys.argv[3] == "fail":
                time.sleep(1.0)
                raise RuntimeError("the parent failed")
            time.sleep(120)
    except KeyboardInterrupt as e:
        what, code = interrupted_by(e)
        print(f"stopped by {what}", flush=True)
        sys.exit(code)
""")


def _parent(tmp_path, *args: str, preexec=None) -> Started:
    return Started([sys.executable, "-c", PARENT, *args], tmp_path / "logs", env=ENV, preexec_fn=preexec)


@pytest.mark.parametrize("sig,code,what", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_stop_signal_stops_the_parent_and_every_child(tmp_path, sig, code, what):
    with _parent(tmp_path, "10", "plain", "wait", preexec=sigint_default) as run:
        kids = run.wait_for_kids(2, timeout=300)
        wait_until(lambda: "ready" in run.stdout, 300, "the parent ready", run.p)
        run.p.send_signal(sig)
        assert run.wait(timeout=30) == code, run.stderr
        assert f"stopped by {what}" in run.stdout
        assert not [k for k in kids if alive(k)]  # stopped and waited for: not even a zombie


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    with _parent(tmp_path, "1.5", "stubborn", "wait") as run:
        kids = run.wait_for_kids(2, timeout=300)
        wait_until(lambda: run.stderr.count("ignoring") == 2, 300, "the children ignoring SIGTERM", run.p)
        t0 = time.monotonic()
        run.p.terminate()
        assert run.wait(timeout=30) == 143
        assert 1.5 <= time.monotonic() - t0 < 20  # SIGTERM, the grace, then SIGKILL
        assert not [k for k in kids if alive(k)]


def test_the_parents_own_failure_stops_its_children(tmp_path):
    with _parent(tmp_path, "10", "plain", "fail") as run:
        kids = run.wait_for_kids(2, timeout=300)
        assert run.wait(timeout=300) == 1 and "RuntimeError: the parent failed" in run.stderr
        assert not [k for k in kids if alive(k)]


def test_children_of_a_parent_killed_outright_stop_themselves(tmp_path):
    """SIGKILL cannot be caught: the children watch their parent (SLCA_PARENT_PID) and stop once it is gone."""
    child = ("import time; from slca._procs import signals_raise, watch_parent_from_env; watch_parent_from_env()\n"
             "try:\n    with signals_raise():\n        print('watching', flush=True); time.sleep(120)\n"
             "except KeyboardInterrupt:\n    print('child stopped', flush=True)")
    parent = ("import sys, time; from slca._procs import Children\nkids = Children()\n"
              f"for i in range(2): kids.start(str(i), [sys.executable, '-c', {child!r}], log=sys.stdout)\n"
              "print('ready', flush=True); time.sleep(120)")
    with Started([sys.executable, "-c", parent], tmp_path / "logs", env=ENV) as run:
        kids = run.wait_for_kids(2, timeout=300)
        wait_until(lambda: run.stdout.count("watching") == 2, 300, "the children watching", run.p)
        run.p.kill()
        run.wait(timeout=30)
        took = wait_until(lambda: not [k for k in kids if alive(k)], 20, "the children stopped")
        assert took < 10
        assert run.stdout.count("child stopped") == 2  # each stopped by its own SIGTERM handling, not killed


def test_children_in_process_are_stopped_however_the_block_ends():
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    with pytest.raises(ValueError):
        with Children(grace=5) as kids:
            p = kids.start("s", sleeper, log=subprocess.DEVNULL)
            raise ValueError("an error in the parent")
    assert p.poll() == -signal.SIGTERM
    assert kids.stop() == []  # nothing left to stop


def test_interrupted_names_the_signal_and_the_exit_status():
    assert interrupted_by(Interrupted(signal.SIGTERM)) == ("SIGTERM", 143)
    assert interrupted_by(Interrupted(signal.SIGINT)) == ("Ctrl-C", 130)
    assert interrupted_by(KeyboardInterrupt()) == ("Ctrl-C", 130)
    assert isinstance(Interrupted(signal.SIGHUP), KeyboardInterrupt)


def test_a_signal_ignored_at_the_start_stays_ignored(tmp_path):
    """``nohup slca compare ...``: SIGHUP was ignored before slca started, and slca leaves it so."""
    code = ("import signal, time; from slca._procs import signals_raise\n"
            "with signals_raise():\n    print('ready', flush=True); time.sleep(3)\nprint('survived', flush=True)")
    with Started([sys.executable, "-c", code], tmp_path / "logs", env=ENV,
                 preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) as run:
        wait_until(lambda: "ready" in run.stdout, 300, "ready", run.p)
        run.p.send_signal(signal.SIGHUP)
        assert run.wait(timeout=30) == 0 and "survived" in run.stdout
