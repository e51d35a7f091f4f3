"""A child process dies with its parent, even when the parent is killed with -9.

Why: the processes a run starts for itself (DataLoader workers that decode images) must never
outlive it: an orphan would go on holding memory and files after the user stopped the run.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys


def die_with_parent(_worker_id: int = 0) -> None:
    """In the child: ask the kernel to kill this process when its parent dies (Linux
    ``PR_SET_PDEATHSIG``); exit at once if the parent is already gone. (The argument lets
    torch's DataLoader call it as a ``worker_init_fn``.)"""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() == 1:  # the parent is already gone
            os._exit(1)
