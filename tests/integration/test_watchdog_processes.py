"""What the watchdog reads off real hung processes (trainkit/run/watchdog.py `examine`): the stacks a rank dumps on
DUMP_SIGNAL while its main thread is blocked in C, a process frozen by SIGSTOP, and a user's script that beats with a
bare file and so cannot dump (it must not be sent the signal, whose default action would end it)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.helpers.waiting import wait_for
from training.common.heartbeat import HEARTBEAT_DIR_ENV
from trainkit.run import stalls
from trainkit.run import watchdog as wd

DEADLOCK = """
import threading
from training.common.heartbeat import process_heartbeat
process_heartbeat().beat(5)
def stuck_here():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
print("ready", flush=True)
stuck_here()
"""
FROZEN = """
import os, signal
from training.common.heartbeat import process_heartbeat
process_heartbeat().beat(5)
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""
BARE = """
import os, time
open(os.path.join(os.environ["TRAINKIT_HEARTBEAT_DIR"], "rank-" + os.environ["RANK"]), "w").write("5")
print("ready", flush=True)
time.sleep(600)
"""


def test_examine_names_a_deadlock_a_frozen_rank_and_a_script_that_cannot_dump(tmp_path):
    beats = tmp_path / "beats"
    beats.mkdir()
    processes, workers = [], []
    for rank, code in enumerate((DEADLOCK, FROZEN, BARE)):
        log = tmp_path / f"{rank}.err"
        env = {HEARTBEAT_DIR_ENV: str(beats), "RANK": str(rank), "PATH": "/usr/bin:/bin"}
        with log.open("w") as err:
            process = subprocess.Popen(
                [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=err, text=True
            )
        assert process.stdout.readline().strip() == "ready"
        processes.append(process)
        workers.append(stalls.Worker(rank, process.pid, str(log)))
    try:
        wait_for(lambda: stalls.process_state(processes[1].pid) == "T", 10, "rank 1 frozen")
        dog = wd.Watchdog(beats, stall_timeout=1, clock=lambda: time.time() + 3600)
        stalled = dog.look(force=True)
        assert stalled is not None and set(stalled.beats) == {0, 1, 2}
        report = stalls.examine(stalled, workers, wait_s=5)
        doing = {rank: entry["doing"] for rank, entry in report["ranks"].items()}
        assert doing["0"].startswith("not in a collective: <string>:") and doing["0"].endswith("in stuck_here")
        assert doing["1"] == "stopped by a signal"
        assert doing["2"] == "no stack dump (the script does not use trainkit's heartbeat)"
        assert report["not_arrived"] == [0, 1] and report["step"] == 5
        assert "most recent call first" in (tmp_path / "0.err").read_text()
        assert processes[2].poll() is None  # never sent the dump signal, which would have ended it
    finally:
        for process in processes:
            process.send_signal(signal.SIGKILL)
            process.wait()
