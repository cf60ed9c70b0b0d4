"""The fault scenarios, the job each runs, and what a scenario's run records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainkit.errors import SpecError

BACKENDS = ("c10d", "etcd")


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str
    # What the job must do, per backend: "finished" unless listed here.
    expected: dict[str, str] = field(default_factory=dict)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("worker-kill", "SIGKILL one worker process of the last node"),
        Scenario("node-kill", "SIGKILL the last node: its agent and its workers at once"),
        Scenario("agent-kill", "SIGKILL only the last node's agent (its workers die with it)"),
        Scenario("agent-term", "SIGTERM the last node's agent (a drained or preempted node)"),
        Scenario(
            "node0-kill",
            "SIGKILL node 0: rank 0's node and, with c10d, the host of the rendezvous store",
            expected={"c10d": "error"},
        ),
        Scenario(
            "store-loss",
            "the rendezvous store dies: etcd is SIGKILLed and restarted; with c10d, node 0's agent (the store) is",
            expected={"c10d": "error"},
        ),
        Scenario("node-return", "SIGKILL the last node, then start it again once the job has recovered"),
    )
}


@dataclass
class Settings:
    """The job every scenario runs: small enough to finish in well under a minute on 2 CPU cores."""

    model: str = "llama2-tiny"
    steps: int = 20
    checkpoint_interval: int = 4
    fault_step: int = 9
    nodes: str = "1:2"
    nproc: int = 1
    max_restarts: int = 3
    # A scenario ends as "timeout" when its job shows no progress (no new step, no new event) for `stall_s`, or
    # has not ended after `timeout_s`. Progress, not wall time: on a loaded machine (make test runs the matrix
    # beside the whole suite) steps slow down 10-20x and a healthy scenario took up to 150 s, while a hung
    # rendezvous stays silent. The stall window stays above the 60 s recovery budget the tests hold.
    stall_s: float = 120.0
    timeout_s: float = 600.0

    def overrides(self, backend: str, run_id: str, runs_dir: Path, endpoint: str | None) -> dict:
        return {
            "model": self.model,
            "steps": self.steps,
            "checkpoint_interval": self.checkpoint_interval,
            "nodes": self.nodes,
            "nproc": self.nproc,
            "max_restarts": self.max_restarts,
            "rdzv": backend,
            "rdzv_endpoint": endpoint,
            "run_id": run_id,
            "runs_dir": str(runs_dir),
            "metrics_port": 0,
        }


@dataclass
class Result:
    scenario: str
    backend: str
    expected: str
    outcome: str
    seconds: float
    restarts: int | None = None
    recovery_s: float | None = None
    steps_lost: int | None = None
    final_step: int | None = None
    final_world_size: int | None = None
    final_loss: float | None = None
    loss_delta: float | None = None
    seconds_to_error: float | None = None
    error: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome == self.expected and not self.problems


def select(scenarios: str, backends: str) -> list[tuple[str, str]]:
    """Scenario x backend pairs from comma lists ("all" for every one); unknown names are an error."""
    names = list(SCENARIOS) if scenarios == "all" else [s.strip() for s in scenarios.split(",") if s.strip()]
    chosen = list(BACKENDS) if backends == "all" else [b.strip() for b in backends.split(",") if b.strip()]
    for value, allowed, flag in ((names, SCENARIOS, "--scenario"), (chosen, BACKENDS, "--rdzv")):
        unknown = [v for v in value if v not in allowed]
        if unknown or not value:
            raise SpecError(f"{flag} {', '.join(unknown) or '(empty)'}: choose from all, {', '.join(allowed)}")
    return [(name, backend) for backend in chosen for name in names]
