"""The stall watchdog on real 2-process FSDP runs: a rank made to hang (training/common/faults.py) while every
process stays alive, with --collective-timeout at its 600 s default, which alone would leave the job waiting. The
node's torchrun agent (trainkit/run/watchdog.py) finds the stall, dumps every rank's stacks into its log, records a
`stalled` event and restarts the job from its last checkpoint; with no restart left the job fails with the reason.
"""

from __future__ import annotations

import json
import re

from tests.helpers.product import (
    invoke,
    job_processes,
    killed_after_checkpoint,
    output,
    read_jsonl,
    start_invoke,
    tiny_args,
)
from tests.helpers.waiting import wait_for
from training.common.faults import HANG_ENV, SLOW_SAVE_ENV, TIME_SCALE_ENV

STALL = "6"  # seconds: far above a tiny step here (~0.3 s), far below what the CI run may wait


def events(run_dir, kind: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


def test_a_hang_restarts_in_place_a_sigkill_continues_on_one_process_and_a_frozen_rank_with_no_restart_fails(
    tiny_run, tmp_path
):
    """Two runs at once (most of either's time is waiting: the machine has room for both).

    - In step 22, rank 0's read of its data never returns and rank 1 deadlocks (a lock taken twice), both outside any
      collective: the watchdog restarts the job in place from step 20. After its step-40 checkpoint the whole job is
      SIGKILLed, as when a machine is lost, and the same command run again with `--nproc 1` (the capacity left)
      takes the run over and continues it from that checkpoint on one process: the same run (its derived id does not
      hang on the size), its FSDP2 checkpoint resharded. Otherwise the same command as the session's undisturbed
      `make train` run, whose losses it repeats on all 60 steps, within the elastic tests' tolerance. One run for the
      three recoveries: the SIGKILL had a run of its own before (38 s of the fresh-clone CI).
    - Rank 1 frozen from outside (SIGSTOP) in step 7, the case measured before the watchdog, when the job sat for
      good; in scaled time (100 watchdog seconds a second, so --stall-timeout 600 is 6 s). Its step-4 checkpoint
      takes 900 s, longer than the fixed 600 s a save got before, and is not ended: 38 MB at --storage-mb-s 0.04
      allow it 24 min, as the launcher says at start. The restart freezes again at the same step, and the job ends
      then, with restarts left, saying why."""
    frozen_runs = tmp_path / "frozen-runs"
    flags = ("--steps", "12", "--checkpoint-interval", "4", "--stall-timeout", "600", "--storage-mb-s", "0.04")
    scaled = {HANG_ENV: "slowsave@0:4,sigstop@1:7*2", SLOW_SAVE_ENV: "9", TIME_SCALE_ENV: "100"}
    frozen = start_invoke(*tiny_args(frozen_runs, *flags, "--max-restarts", "2", "--run-id", "frozen"), env=scaled)
    runs = tmp_path / "runs"
    runs.mkdir()
    command = tiny_args(runs, "--stall-timeout", STALL)
    hangs = {HANG_ENV: "data@0:22,deadlock@1:22"}
    launcher, run_dir, resumed_from = killed_after_checkpoint(runs, 40, *command, env=hangs)  # after the restart
    assert 40 <= resumed_from < 60

    (stalled,) = events(run_dir, "stalled")
    # who did not arrive, from the stacks each rank wrote: both ranks outside any collective
    assert stalled["step"] == 21 and stalled["not_arrived"] == [0, 1] and stalled["in_collective"] == [], stalled
    assert all("not in a collective: " in stalled["ranks"][r]["doing"] for r in "01"), stalled["ranks"]
    assert stalled["restart"] and stalled["allowance"] == "--stall-timeout" and stalled["seconds"] >= float(STALL)
    assert [e["step"] for e in events(run_dir, "resume")] == [20]
    # every rank's stacks are in its log of the round that hung, showing where: the data read, the lock's second take
    (launch,) = [path for path in (run_dir / "logs").iterdir() if (path / "attempt_1").is_dir()]
    texts = [log.read_text() for log in sorted(launch.glob("attempt_0/*/stderr.log"))]
    assert len(texts) == 2 and all("most recent call first" in text for text in texts)
    called_from = r'in hang_here\n  File ".*/training/(llm|common)/trainer.py", line \d+ in '
    assert re.search(called_from + "train_step", texts[0]) and re.search(called_from + "fit", texts[1])

    result = invoke(*command, "--nproc", "1", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The killed launcher's lock went with it: the run is taken over, and said so.
    assert f"was last launched by pid {launcher}" in result.stdout and "taking it over" in result.stdout
    assert f"note: resuming step {resumed_from} of a 2-process run on 1 process\n" in result.stdout
    assert [(e["step"], e["world_size"]) for e in events(run_dir, "resume")] == [(20, 2), (resumed_from, 1)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == resumed_from and summary["restarts"] == 2 and summary["steps"] == 60
    assert summary["world_size"] == 1 and json.loads((run_dir / "spec.json").read_text())["parallelism"]["nproc"] == 1
    losses = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")}
    reference = {r["step"]: r["loss"] for r in read_jsonl(tiny_run / "metrics.jsonl")}
    assert sorted(losses) == list(range(1, 61)), "steps must not repeat or vanish"
    for step in range(1, 61):
        assert abs(losses[step] - reference[step]) <= 1e-4, (step, losses[step], reference[step])

    assert frozen.wait(timeout=240) != 0
    said = output(frozen)
    assert "note: stall watchdog: checkpoint allowance 24 min: 38.0 MB at 0.04 MB/s x 1.5;" in said, said[:3000]
    line = said.strip().splitlines()[-1]
    assert line.startswith("error: run frozen failed: stalled: ") and "after step 6" in line, said[-3000:]
    assert "did not arrive: rank 1 stopped by a signal" in line
    assert "; the run stalled after step 6 before: a hang of the job's own, which a restart repeats" in line, line
    assert line.endswith("(not restarted: a restart would fail the same way)"), line
    status = invoke("status", "--run-id", "frozen", "--runs-dir", str(frozen_runs))
    assert "stalled: " in status.stdout and "rank 1 stopped by a signal" in status.stdout, status.stdout
    assert "a hang of the job's own, which a restart repeats" in status.stdout, status.stdout
    first, again = events(frozen_runs / "frozen", "stalled")
    assert first["restart"] and not first["repeated"] and first["attempt"] == 0
    assert not again["restart"] and again["repeated"] and again["attempt"] == 1 and again["in_collective"] == [0]
    (saved,) = [e for e in events(frozen_runs / "frozen", "checkpoint") if e["step"] == 4]
    assert saved["seconds"] >= 9  # 900 s in the watchdog's scaled time, and not ended
    wait_for(lambda: not job_processes(str(frozen_runs)), 10, "every process of the run gone")
