"""Worker lifetime: a worker never outlives its agent, and a stop request ends at a step boundary.

torchrun starts every worker in a session of its own, so signals to the agent's process group do
not reach workers, and a SIGKILLed agent leaves them running as orphans that keep writing
checkpoints. On Linux the worker asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG), the same fate a worker meets when its node is lost.

An orderly stop (torchrun forwards SIGTERM when its node is drained, preempted or the job is
stopped) is turned into a flag, so the step in flight completes and a checkpoint can be written.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

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


# Seconds a stopping worker has before it is killed: torchrun's default worker shutdown timeout
# (on Kubernetes, set terminationGracePeriodSeconds to at least this).
STOP_GRACE_ENV = "TRAINKIT_STOP_GRACE_S"
STOP_GRACE_S = 30.0


class StopSignal:
    """SIGTERM (or SIGINT) asks for a stop at the next step boundary instead of killing the step.

    The trainer polls `pending()` once per step (all ranks agree through one all-reduce, see
    RunContext.stop_requested), saves a checkpoint when the grace period allows it, and exits. A
    second signal exits at once.
    """

    def __init__(self, grace_s: float | None = None, clock=time.monotonic):
        self.grace_s = float(os.environ.get(STOP_GRACE_ENV, STOP_GRACE_S)) if grace_s is None else grace_s
        self.clock = clock
        self.received_at: float | None = None
        self.signum: int | None = None

    def install(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        if self.received_at is not None:
            os._exit(128 + signum)
        self.received_at, self.signum = self.clock(), signum

    @property
    def pending(self) -> bool:
        return self.received_at is not None

    def time_allows(self, seconds_needed: float) -> bool:
        """Whether work of `seconds_needed` (with a 50% margin) ends inside the grace period."""
        if self.received_at is None:
            return True
        left = self.grace_s - (self.clock() - self.received_at)
        return 1.5 * seconds_needed < left


def exit_finished() -> None:
    """Leave a finished worker without interpreter teardown.

    Everything the run owns is on disk by now (checkpoints and summary are fsynced or closed) and the
    process group is destroyed. Under load, teardown of torch's native threads sometimes aborted a
    rank after the run had finished ("terminate called without an active exception", exit -6),
    which torchrun counts as a failure and answers with a needless restart (seen in the chaos
    matrix). Flush and exit directly instead.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
