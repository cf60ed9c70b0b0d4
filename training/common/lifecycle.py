"""Worker lifetime: a training worker never outlives the agent (torchrun) that started it.

torchrun starts every worker in a session of its own, so signals to the agent's process group do
not reach workers, and a SIGKILLed agent leaves them running as orphans that keep writing
checkpoints. On Linux the worker asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG), the same fate a worker meets when its node is lost.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # best effort: without it, orphans are still stopped by the launcher's cleanup
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
