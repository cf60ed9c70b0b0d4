"""torchrun, with one rule added: a worker that exits with EXIT_NO_RETRY is not restarted.

torchrun restarts its whole worker group after any failure, up to --max-restarts, whatever the
failure was; a full volume, unreadable data or a diverged loss then fail the same way three more
times before the job ends. Its agent has no hook for this, so this module runs torch's own
`torch.distributed.run` with its LocalElasticAgent replaced by a subclass that, after each look at
its workers, sets the restarts left to 0 when a failed worker exited with EXIT_NO_RETRY
(training/common/failure.py); the agent then stops its group and returns, as it does when its
restarts are spent. The subclass also reports every failed worker it sees to the launcher's channel
(a rank killed by a signal cannot report itself). Written against torch 2.13's
torch/distributed/elastic/agent/server/api.py (`_invoke_run` reads `_remaining_restarts` after
`_monitor_workers`) and torch/distributed/launcher/api.py (`launch_agent` builds the agent from the
module's `LocalElasticAgent`); tests/integration/test_agent.py holds it to that with a real torchrun.

Exit code: 0 when the workers finished; EXIT_NO_RETRY when one of them said a restart cannot help; 1
when the group failed with its restarts spent (torchrun's own code); EXIT_RENDEZVOUS when this agent
could not meet its peers (the store unreachable or closed, a peer missing past the timeout: a fault
of the store's node or the network, so the EKS pod is replaced, trainkit/backends/eks/pod.py); 128 +
the signal when it was stopped. torchrun's ChildFailedError report (a traceback and a table whose
error file is usually <N/A>) becomes one line per failed rank, and a rendezvous failure or a stop one
line too: the launcher says the cause itself.

    python -m trainkit.run.agent <torchrun's arguments>
"""

from __future__ import annotations

import os
import sys
import time

from training.common.failure import EXIT_NO_RETRY, MESSAGE_CHARS, send

EXIT_RENDEZVOUS = 4
NODE_ENV = "TRAINKIT_NODE"
"""The node's name in this agent's own reports (the local launcher's node-N; on EKS the pod's name)."""


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


def rendezvous_record(error: BaseException) -> dict:
    """This agent's own failure to meet its peers, as a record for the launcher."""
    message = (str(error).strip().splitlines() or [""])[0][:MESSAGE_CHARS]
    node = os.environ.get(NODE_ENV) or os.environ.get("POD_NAME") or "this node"
    return {
        "source": "agent",
        "rank": None,
        "time": time.time(),
        "exit_code": EXIT_RENDEZVOUS,
        "cause": f"torchrun on {node}: rendezvous failed: {type(error).__name__}: {message}".rstrip(": "),
        "permanent": False,
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
                    assert hasattr(self, "_remaining_restarts"), "torch's agent no longer counts restarts this way"
                    self._remaining_restarts = 0
            return result

    return NoRetryAgent


def main(argv: list[str] | None = None) -> int:
    import torch.distributed.launcher.api as launcher
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import parse_args, run

    agent_class = _agent_class()
    base = agent_class.__mro__[1]
    if not hasattr(launcher, "LocalElasticAgent") or not hasattr(base, "_monitor_workers"):
        import torch

        print(
            f"trainkit.run.agent: torch {torch.__version__} builds its elastic agent another way than torch 2.13, "
            "which this launcher was written against; use torch 2.11-2.13",
            file=sys.stderr,
            flush=True,
        )
        return 2
    launcher.LocalElasticAgent = agent_class
    try:
        run(parse_args(argv))
    except SignalException as error:  # torch's handler for SIGTERM/SIGINT/...: the workers were stopped
        print(f"torchrun: stopped by {error.sigval.name}", file=sys.stderr, flush=True)
        return 128 + int(error.sigval)
    except RendezvousError as error:
        record = rendezvous_record(error)
        send(record)
        print(record["cause"], file=sys.stderr, flush=True)
        return EXIT_RENDEZVOUS
    except ChildFailedError as error:
        codes = {rank: failure.exitcode for rank, failure in sorted(error.failures.items())}
        for rank, code in codes.items():
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            print(f"torchrun: rank {rank} failed ({how})", file=sys.stderr, flush=True)
        return EXIT_NO_RETRY if EXIT_NO_RETRY in codes.values() else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
