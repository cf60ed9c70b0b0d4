"""Every record format trains a 2-process decoder run from a file written here, and the data is tokenised once:
by one process of the run, into the shared cache that a second run (another run id, same data) reads without
tokenising; a changed file is tokenised again. (Which tokens each format trains: tests/unit/test_text_data.py; the
dialogue-summary format is the synthetic data every other decoder run reads.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers.product import output, read_jsonl, start_invoke, tiny_args

# --seq-len 160: examples are packed whole (training/text/packing.py); each chat is about 253 tokens, its first reply
# after 127, so every one keeps its replies and loses only some of its prompt.
FLAGS = ("--nproc", "2", "--steps", "3", "--seq-len", "160", "--global-batch-size", "4", "--micro-batch-size", "2")
FLAGS += ("--checkpoint-interval", "0", "--warmup-steps", "1")
FACTS = [("Ana", "Lima"), ("Bo", "Oslo"), ("Cy", "Rome"), ("Di", "Kyiv")]


def records(kind: str, count: int = 160) -> list[dict]:
    made = []
    for index in range(count):
        name, city = FACTS[index % len(FACTS)]
        question, answer = f"Where does {name} live? ({index})", f"{name} lives in {city}."
        made.append(
            {
                "chat": {
                    "messages": [
                        {"role": "system", "content": "Answer in one sentence."},
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": answer},
                        {"role": "user", "content": "And the country?"},
                        {"role": "assistant", "content": f"The city is {city}."},
                    ]
                },
                "alpaca": {"instruction": "Answer.", "input": question, "output": answer}
                if index % 2
                else {"instruction": question, "output": answer},
                "prompt-response": {"prompt": question, "response": answer},
                "text": {"text": f"{question} {answer} {name} and {city} again."},
            }[kind]
        )
    return made


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tokenising_ranks(run_dir: Path) -> int:
    """How many of the run's processes tokenised (each says so in its own log)."""
    return sum("tokenising " in log.read_text() for log in (run_dir / "logs").rglob("stdout.log"))


def data_event(run_dir: Path) -> dict:
    """What the run's start event says of its data."""
    (event,) = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "start"]
    return event["data"]


@pytest.fixture(scope="module")
def format_runs(tmp_path_factory):
    """One 2-process run per format, all at once, into one runs folder."""
    root = tmp_path_factory.mktemp("formats")
    runs = root / "runs"
    started = {}
    for kind in ("chat", "alpaca", "prompt-response", "text"):
        data = write(root / f"{kind}.jsonl", records(kind))
        started[kind] = (start_invoke(*tiny_args(runs, "--dataset", str(data), "--run-id", kind, *FLAGS)), data)
    for kind, (process, _data) in started.items():
        assert process.wait(timeout=300) == 0, (kind, output(process)[-3000:])
    return runs, {kind: data for kind, (_process, data) in started.items()}


@pytest.mark.parametrize("kind", ["chat", "alpaca", "prompt-response", "text"])
def test_each_format_trains_two_processes_tokenised_by_one(format_runs, kind):
    runs, _files = format_runs
    run_dir = runs / kind
    event = data_event(run_dir)
    assert event["format"] == kind and event["built"] and event["records"] == 160
    assert tokenising_ranks(run_dir) == 1
    losses = [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert len(losses) == 3 and all(math.isfinite(loss) and loss > 0 for loss in losses)


def test_another_run_on_the_same_data_reads_the_cache_and_a_changed_file_is_tokenised_again(format_runs):
    runs, files = format_runs
    again = start_invoke(*tiny_args(runs, "--dataset", str(files["chat"]), "--run-id", "chat-again", *FLAGS))
    write(files["text"], records("text", count=170))  # the text run's file, rewritten in place
    changed = start_invoke(*tiny_args(runs, "--dataset", str(files["text"]), "--run-id", "text-changed", *FLAGS))
    for process in (again, changed):
        assert process.wait(timeout=300) == 0, output(process)[-3000:]
    event = data_event(runs / "chat-again")
    assert not event["built"] and event["cache"] == data_event(runs / "chat")["cache"]
    assert tokenising_ranks(runs / "chat-again") == 0
    assert "read from the cache" in output(again)
    same = [r["loss"] for r in read_jsonl(runs / "chat-again" / "metrics.jsonl")]
    assert same == [r["loss"] for r in read_jsonl(runs / "chat" / "metrics.jsonl")]
    event = data_event(runs / "text-changed")
    assert event["built"] and event["records"] == 170 and event["cache"] != data_event(runs / "text")["cache"]
    assert tokenising_ranks(runs / "text-changed") == 1
