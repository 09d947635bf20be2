"""Run the real ``slca`` CLI and SIGKILL its own process at a chosen file-system event.

    python tests/_killhook.py RUN_DIR LOG KILL_AT -- train --set ...

Every Python audit event that opens, creates, renames or removes something under
RUN_DIR in the main thread is one event (the on-disk state of a run can only
change at such a point, so killing before each of them reaches every state a
kill can leave, torn appends apart). Events are appended to LOG (``-`` for none)
as ``name<TAB>path relative to RUN_DIR``. KILL_AT is ``0`` (never), ``N`` (the
N-th event) or ``N:TEXT`` (the N-th event whose line contains TEXT); the
process then sends itself SIGKILL, exactly as an outside ``kill -9``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

EVENTS = {"open", "os.rename", "os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree"}


def install(run_dir: str, log: str, kill_at: str) -> None:
    root = os.path.abspath(run_dir)
    n_str, _, text = kill_at.partition(":")
    target = int(n_str)
    out = open(log, "a", buffering=1) if log != "-" else None
    seen = [0]
    main = threading.main_thread()

    def hook(event: str, args: tuple) -> None:
        if event not in EVENTS or threading.current_thread() is not main or not args or not isinstance(args[0], str):
            return
        path = os.path.abspath(args[0])
        if not path.startswith(root + os.sep):
            return
        line = f"{event}\t{os.path.relpath(path, root)}"
        if out is not None:
            out.write(line + "\n")
        if target and (not text or text in line):
            seen[0] += 1
            if seen[0] == target:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)


if __name__ == "__main__":
    run_dir, log, kill_at, sep, *cli_args = sys.argv[1:]
    assert sep == "--", sys.argv
    install(run_dir, log, kill_at)
    from slca.cli import main

    sys.argv = ["slca", *cli_args]
    main()
