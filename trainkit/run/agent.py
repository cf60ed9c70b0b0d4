"""torchrun, with one rule added: a worker that exits with EXIT_NO_RETRY is not restarted.

torchrun restarts its whole worker group after any failure, up to --max-restarts, whatever the
failure was; a full volume, unreadable data or a diverged loss then fail the same way three more
times before the job ends. Its agent has no hook for this, so this module runs torch's own
`torch.distributed.run` with its LocalElasticAgent replaced by a subclass that, after each look at
its workers, sets the restarts left to 0 when a failed worker exited with EXIT_NO_RETRY
(training/common/failure.py); the agent then stops its group and returns, as it does when its
restarts are spent. The subclass also reports every failed worker it sees to the launcher's channel
(a rank killed by a signal cannot report itself). Written against torch 2.11-2.13's
torch/distributed/elastic/agent/server/api.py (`_invoke_run` reads `_remaining_restarts` after
`_monitor_workers`) and torch/distributed/launcher/api.py (`launch_agent` builds the agent from the
module's `LocalElasticAgent`); tests/integration/test_agent.py holds it to that with a real torchrun.

Exit code: 0 when the workers finished; EXIT_NO_RETRY when one of them said a restart cannot help; 1
when the group failed with its restarts spent (torchrun's own code). torchrun's ChildFailedError
report (a traceback and a table whose error file is usually <N/A>) becomes one line per failed rank:
the launcher says the cause itself.

    python -m trainkit.run.agent <torchrun's arguments>
"""

from __future__ import annotations

import sys
import time

from training.common.failure import EXIT_NO_RETRY, send


def agent_record(rank: int, failure, attempt: int, log: str | None) -> dict:
    """What the agent saw of one failed worker (torch's ProcessFailure: exit code, or minus the signal)."""
    killed = failure.exitcode < 0
    return {
        "source": "agent",
        "rank": rank,
        "attempt": attempt,
        "time": time.time(),
        "exit_code": failure.exitcode,
        "signal": failure.signal_name() if killed else None,
        "permanent": failure.exitcode == EXIT_NO_RETRY,
        "log": log,
    }


def _agent_class():
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class NoRetryAgent(LocalElasticAgent):
        """LocalElasticAgent that spends no restart on a failure its worker called permanent."""

        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            if result.is_failed():
                spec = worker_group.spec
                attempt = spec.max_restarts - self._remaining_restarts
                stderrs = getattr(self._pcontext, "stderrs", None) or {}
                for rank, failure in sorted(result.failures.items()):
                    send(agent_record(rank, failure, attempt, stderrs.get(failure.local_rank) or None))
                if any(failure.exitcode == EXIT_NO_RETRY for failure in result.failures.values()):
                    self._remaining_restarts = 0
            return result

    return NoRetryAgent


def main(argv: list[str] | None = None) -> int:
    import torch.distributed.launcher.api as launcher
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    launcher.LocalElasticAgent = _agent_class()
    try:
        run(parse_args(argv))
    except ChildFailedError as error:
        codes = {rank: failure.exitcode for rank, failure in sorted(error.failures.items())}
        for rank, code in codes.items():
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            print(f"torchrun: rank {rank} failed ({how})", file=sys.stderr, flush=True)
        return EXIT_NO_RETRY if EXIT_NO_RETRY in codes.values() else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
