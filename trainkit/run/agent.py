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

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from training.common.checkpoint import HOST_ENV
from training.common.failure import EXIT_NO_RETRY, MESSAGE_CHARS, last_line, node_name, send
from training.common.faults import TIME_SCALE_ENV
from training.common.files import EVENTS_FILE, append_event, node_events_file
from training.common.heartbeat import HEARTBEAT_DIR_ENV
from training.spec import RUN_DIR_ENV, SPEC_FILE, read_job
from trainkit.run import stalls, watchdog

EXIT_RENDEZVOUS = 4
ATTEMPT_EVENT = "attempt"
"""An agent's event when it starts its workers: each is one attempt of torchrun's (the first, or a restart), so
`invoke status` counts what torchrun did whatever the workload (trainkit/backends/local/runs.py)."""
SCHEDULER_RESTARTS_ENV = "TRAINKIT_SCHEDULER_RESTARTS_LEFT"
"""Where torchrun restarts nobody and the job's scheduler starts the job again instead (Batch: its retry strategy's
attempts left after this one, trainkit/backends/batch/node.py), how many times it still will."""
RESTART_HOOK_ENV = "TRAINKIT_RESTART_HOOK"
"""`module:function` the agent calls before it starts its workers again in a new round (not the first), after the
rendezvous, while every node's workers are stopped: where the nodes share no disk, the SageMaker host's hook puts the
others' checkpoint parts here (trainkit/backends/sagemaker/restore.py). It returns a line for the log."""


def attempts(events: list[dict]) -> tuple[int, int]:
    """(launches, attempts) of a run from its agents' ATTEMPT_EVENTs: each launch (a rendezvous id) ran as many
    attempts as its busiest node started rounds of workers (a node that joined late started fewer)."""
    rounds: dict[str, dict[str, int]] = {}
    for event in events:
        if event.get("event") == ATTEMPT_EVENT:
            nodes = rounds.setdefault(str(event.get("submission")), {})
            nodes[str(event.get("node"))] = nodes.get(str(event.get("node")), 0) + 1
    return len(rounds), sum(max(nodes.values()) for nodes in rounds.values())


def before_restart() -> None:
    """RESTART_HOOK_ENV's function, when set; a failure of it is said and the workers start with what is here (a
    checkpoint left incomplete is passed over, training/common/checkpoint.py)."""
    hook = os.environ.get(RESTART_HOOK_ENV)
    if not hook:
        return
    module, _, function = hook.partition(":")
    try:
        import importlib

        said = getattr(importlib.import_module(module), function)()
    except Exception as error:  # noqa: BLE001 - whatever it was, the restart goes on and the log says why
        said = f"failed ({type(error).__name__}: {error}); the workers start from what this node holds"
    print(f"{node_name()}: before the restart: {said}", file=sys.stderr, flush=True)


def agent_record(rank: int, failure, attempt: int, log: str | None, stopped_at: float | None = None) -> dict:
    """What the agent saw of one failed worker (torch's ProcessFailure: exit code, or minus the signal).
    `stopped_at`: the worker was still running when the agent found, at that time, that another one had failed, and
    the agent's stop of the group ended it (SIGTERM, then SIGKILL); what it reported from then on is an effect, not a
    cause (what it reported before, a failure whose process was slow to exit, is not). A worker that exited by itself
    with a code says what it wrote last (its stderr's last line): a script's own words when it recorded no
    exception."""
    killed = failure.exitcode < 0
    return {
        "source": "agent",
        "rank": rank,
        "attempt": attempt,
        "time": time.time(),
        "exit_code": failure.exitcode,
        "signal": failure.signal_name() if killed else None,
        "node_name": node_name(),
        "permanent": failure.exitcode == EXIT_NO_RETRY,
        "stopped": stopped_at is not None,
        "stopped_at": stopped_at,
        "last_line": None if killed or stopped_at is not None else last_line(log),
        "log": log,
    }


def ended_by_themselves(pcontext) -> set[int] | None:
    """The local ranks whose processes have exited, before torch's own look (which stops the rest when one failed);
    None where this torch keeps its processes another way (then no rank is taken for stopped). torch 2.13's
    SubprocessContext keeps a Popen per local rank (`subprocess_handlers`); polling one twice is harmless (Popen
    keeps the exit status)."""
    handlers = getattr(pcontext, "subprocess_handlers", None)
    if not isinstance(handlers, dict) or not all(hasattr(handler, "proc") for handler in handlers.values()):
        return None
    return {local_rank for local_rank, handler in handlers.items() if handler.proc.poll() is not None}


def rendezvous_record(error: BaseException, closed: bool) -> dict:
    """This agent's own failure to meet its peers, as a record for the launcher. A closed rendezvous is permanent:
    the job already ended on another node (torch closes it when an agent leaves with an error, a rendezvous
    timeout included) or its id was used before, and every restart or replaced pod would meet it closed again."""
    lines = str(error).strip().splitlines()
    message = (lines[0] if lines else "")[:MESSAGE_CHARS]
    inner = error.__cause__ or error.__context__
    if inner is not None and "inner exception" in message:  # c10d's "... has failed. See inner exception ..."
        message = f"{message} ({type(inner).__name__}: {str(inner).strip().splitlines()[0][:MESSAGE_CHARS]})"
    what = "rendezvous closed" if closed else "rendezvous failed"
    node = node_name()
    return {
        "source": "agent",
        "rank": None,
        "node_name": node,
        "time": time.time(),
        "exit_code": EXIT_NO_RETRY if closed else EXIT_RENDEZVOUS,
        "cause": f"torchrun on {node}: {what}: {type(error).__name__}: {message}".rstrip(": "),
        "permanent": closed,
    }


def _meeting_errors() -> tuple[type[BaseException], ...]:
    """What torch 2.13 raises when an agent cannot meet its peers: the rendezvous' own errors, and the store's
    (c10d's TCPStore: DistNetworkError, DistStoreError), which the agent's rank assignment and the rendezvous'
    store info reach outside the rendezvous' own wrapping. etcd's store (torch's EtcdStore) answers a timed-out
    key with a plain LookupError (matched exactly, not its subclasses KeyError and IndexError)."""
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    found: list[type[BaseException]] = [RendezvousError, DistNetworkError, DistStoreError]
    try:
        from etcd import EtcdException
    except ImportError:
        pass
    else:
        found.append(EtcdException)
    return tuple(found)


def _agent_class():
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from training.common.files import publish_rank_files

    class NoRetryAgent(LocalElasticAgent):
        """LocalElasticAgent that spends no restart on a failure its worker called permanent, records where
        each worker's output goes under the run folder (for the console and `invoke logs --rank`, whatever the
        workload: a user's script records nothing itself), and ends workers that stall (trainkit/run/watchdog.py)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._watchdog = make_watchdog()
            self._stalled: set[int] = set()
            self._rounds = 0

        def _attempt(self, spec) -> int:
            """torchrun's restart count of the workers now running (what TORCHELASTIC_RESTART_COUNT tells them)."""
            return spec.max_restarts - self._remaining_restarts

        def _start_workers(self, worker_group):
            if self._rounds:
                before_restart()
            self._rounds += 1
            if self._watchdog is not None:
                self._watchdog.reset()
            self._stalled = set()
            pids = super()._start_workers(worker_group)
            run_dir = os.environ.get(RUN_DIR_ENV)
            if run_dir:
                spec = worker_group.spec
                with contextlib.suppress(OSError):  # a full volume: the run's story loses a line, not its run
                    append_event(
                        Path(run_dir),
                        ATTEMPT_EVENT,
                        file=events_file(),
                        node=node_name(),
                        attempt=self._attempt(spec),
                        submission=spec.rdzv_handler.get_run_id(),
                    )
                stdouts = getattr(self._pcontext, "stdouts", None) or {}
                stderrs = getattr(self._pcontext, "stderrs", None) or {}
                for worker in worker_group.workers:
                    files = {"stdout": stdouts.get(worker.local_rank), "stderr": stderrs.get(worker.local_rank)}
                    files = {name: str(path) for name, path in files.items() if path}
                    if files:
                        publish_rank_files(Path(run_dir), worker.global_rank, files)
            return pids

        def _stop_workers(self, worker_group, *args, **kwargs):
            # Before torch's stop (SIGTERM, then SIGKILL after 30 s): a rank already past its allowance is shown and
            # killed now. A frozen process does not take SIGTERM, and a peer node's new round brings this agent here
            # before its own next look.
            self._end_if_stalled(worker_group, force=True)
            return super()._stop_workers(worker_group, *args, **kwargs)

        def _monitor_workers(self, worker_group):
            self._end_if_stalled(worker_group)
            looked, ended = time.time(), ended_by_themselves(self._pcontext)
            result = super()._monitor_workers(worker_group)
            if result.is_failed():
                attempt = self._attempt(worker_group.spec)
                stderrs = getattr(self._pcontext, "stderrs", None) or {}
                for rank, failure in sorted(result.failures.items()):
                    if rank not in self._stalled:  # the watchdog's own record says why those were ended
                        log = stderrs.get(failure.local_rank) or None
                        stopped = ended is not None and failure.local_rank not in ended
                        send(agent_record(rank, failure, attempt, log and str(log), looked if stopped else None))
                if any(failure.exitcode == EXIT_NO_RETRY for failure in result.failures.values()):
                    assert hasattr(self, "_remaining_restarts"), "torch's agent no longer counts restarts this way"
                    self._remaining_restarts = 0
            return result

        def _end_if_stalled(self, worker_group, force: bool = False):
            """When a rank is past its allowance (`force`: look now, not at the watchdog's pace): show where every rank
            of the node is (stacks into their logs), say why, and kill them: torchrun then restarts the group from the
            last checkpoint, or ends the job when no restart is left. Once per round of workers."""
            if self._watchdog is None or self._stalled:
                return
            stalled = self._watchdog.look(force=force)
            if stalled is None:
                return
            stderrs = getattr(self._pcontext, "stderrs", None) or {}
            workers = [
                stalls.Worker(w.global_rank, w.id, str(stderrs.get(w.local_rank) or "") or None)
                for w in worker_group.workers
                if w.id is not None
            ]
            report = stalls.examine(stalled, workers)
            run_dir = os.environ.get(RUN_DIR_ENV)
            attempt = self._attempt(worker_group.spec)
            submission = worker_group.spec.rdzv_handler.get_run_id()
            before = 0
            with contextlib.suppress(OSError):
                before = stalls.repeated_stall(run_dir and Path(run_dir), report["step"])
            report["repeated"] = before + 1 >= stalls.REPEATS_TO_END
            line = stalls.cause(report)
            if report["repeated"]:  # the same hang again after a restart: each further one would hang there too
                self._remaining_restarts = 0
            restarting = self._remaining_restarts > 0
            by_scheduler = (
                not restarting and not report["repeated"] and int(os.environ.get(SCHEDULER_RESTARTS_ENV) or 0) > 0
            )
            if run_dir:
                with contextlib.suppress(OSError):
                    append_event(
                        Path(run_dir),
                        "stalled",
                        file=events_file(),
                        node=node_name(),
                        attempt=attempt,
                        submission=submission,
                        restart=restarting or by_scheduler,
                        **report,
                    )
            log = next((w.log for w in workers if w.rank == stalled.rank), None)
            send(
                {
                    "source": "agent",
                    "rank": stalled.rank,
                    "attempt": attempt,
                    "time": time.time(),
                    "node_name": node_name(),
                    "cause": line,
                    "stalled": True,
                    "permanent": report["repeated"],
                    "log": log,
                }
            )
            then = "restarting from the last checkpoint" if restarting else "no restart left: the job ends"
            if report["repeated"]:
                global _ENDED_FOR_GOOD
                _ENDED_FOR_GOOD = True
                then = "not restarted: the job ends"
            if by_scheduler:
                then = "the job's next attempt restarts it from the last checkpoint"
            print(f"watchdog on {node_name()}: {line}; {then}", file=sys.stderr, flush=True)
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
            self._stalled = {worker.rank for worker in workers}

    return NoRetryAgent


_ENDED_FOR_GOOD = False
"""Set when this node's watchdog ended its ranks for a stall that a restart would repeat: the agent then exits
EXIT_NO_RETRY (its ranks were killed, so none of them could say so), and no scheduler starts the job again."""


def events_file() -> str:
    """This node's events file: the run's events.jsonl, or the node's own where each host has a copy of the run
    folder synced to one place (SageMaker: HOST_ENV), so the hosts' copies do not replace each other's."""
    host = os.environ.get(HOST_ENV)
    return node_events_file(host) if host else EVENTS_FILE


def make_watchdog() -> watchdog.Watchdog | None:
    """The node's watchdog over the heartbeat folder main() made, with the job's --stall-timeout (0: none) and what
    its checkpoints and export write at the storage's throughput (the spec's, set by the launcher)."""
    folder = os.environ.get(HEARTBEAT_DIR_ENV)
    if not folder:
        return None
    stall_timeout, planned = None, None
    run_dir = os.environ.get(RUN_DIR_ENV)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        job = read_job(Path(run_dir) / SPEC_FILE) if run_dir else None
        if job is not None:
            stall_timeout = job.elastic.stall_timeout
            c = job.checkpointing
            planned = watchdog.budgets(stall_timeout, c.phase_bytes, c.storage_mb_s, c.storage_hosts)
    if stall_timeout == 0:
        return None
    scale = float(os.environ.get(TIME_SCALE_ENV) or 1.0)
    return watchdog.Watchdog(
        Path(folder), stall_timeout, planned=planned, run_dir=run_dir and Path(run_dir), scale=scale
    )


def main(argv: list[str] | None = None) -> int:
    import torch.distributed.launcher.api as launcher
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError
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
    # The ranks' heartbeats (training/common/heartbeat.py): on this node's own disk, gone with the agent.
    beats = tempfile.mkdtemp(prefix="trainkit-heartbeat-")
    os.environ[HEARTBEAT_DIR_ENV] = beats
    try:
        run(parse_args(argv))
    except SignalException as error:  # torch's handler for SIGTERM/SIGINT/...: the workers were stopped
        print(f"torchrun: stopped by {error.sigval.name}", file=sys.stderr, flush=True)
        return 128 + int(error.sigval)
    except ChildFailedError as error:
        codes = {rank: failure.exitcode for rank, failure in sorted(error.failures.items())}
        for rank, code in codes.items():
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            print(f"torchrun: rank {rank} failed ({how})", file=sys.stderr, flush=True)
        return EXIT_NO_RETRY if EXIT_NO_RETRY in codes.values() or _ENDED_FOR_GOOD else 1
    except KeyboardInterrupt:  # a SIGINT before torch's own handler was installed
        print("torchrun: stopped by SIGINT", file=sys.stderr, flush=True)
        return 128 + 2
    except Exception as error:
        if not (isinstance(error, _meeting_errors()) or type(error) is LookupError):
            raise
        record = rendezvous_record(error, closed=isinstance(error, RendezvousClosedError))
        send(record)
        print(record["cause"], file=sys.stderr, flush=True)
        return record["exit_code"]
    finally:
        shutil.rmtree(beats, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
