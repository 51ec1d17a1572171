"""Processes a test run starts that must not outlive it.

An emulator is stopped by its fixture; but a run that is killed (a timeout, ^C twice, an
out-of-memory kill) skips its teardown, and the JVMs it started kept their ports and a
gigabyte each until someone found them. `dying_with_parent` asks Linux to end such a child
when the thread that started it ends (PR_SET_PDEATHSIG, through util-linux's `setpriv`,
which every Debian has: no `preexec_fn`, which is unsafe in a process with threads)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from pathlib import Path


def dying_with_parent(cmd: Sequence[str]) -> list[str]:
    """`cmd`, run so that it is sent SIGKILL when the thread starting it ends; `cmd` as it is
    where that cannot be asked: without `setpriv`, or from a thread other than the main one
    (the signal follows the thread that forked, so a helper thread's child would die with it)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return list(cmd)
    return [setpriv, "--pdeathsig", "KILL", "--", *cmd]


def alive(pid: int) -> bool:
    """Whether process `pid` runs: not gone, not a zombie (it has ended; only its parent's wait
    is missing). Its state follows the last ") " of /proc/PID/stat: the name before it may hold one."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError, IndexError):  # gone before the open, or between it and the read
        return False
    return state != "Z"
