"""`invoke bench startup`: how long a language-model run takes from `invoke train` to its first optimizer step on a
large local dataset, with the tokenised cache cold (this run tokenises) and warm (another run id, same data: it
reads the cache), each repeated. The dataset is written here: `records` chat conversations made from the synthetic
dialogues (a system turn, the dialogue and a request, the summary, a follow-up question and its answer).

`--checkout DIR` times another checkout of trainkit with the same interpreter (its code first on the path), for a
before/after comparison: a checkout that cannot read chat records is given the same conversations as
prompt/response records (the dialogue and request as the prompt, the summary as the response); `--pairs` gives
this checkout the same, to compare like with like.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from training.common.files import publish_text
from training.text.dialogues import make_record
from trainkit.bench.checkout import Checkout, add_record, machine

POLL_S = 0.05


def write_chat(path: Path, count: int, seed: int = 0, pairs: bool = False) -> Path:
    """`count` conversations as chat records (or, `pairs`, prompt/response records of the same text)."""
    rng = random.Random(seed)
    lines = []
    for index in range(count):
        record = make_record(rng, index)
        ask = f"{record['dialogue']}\n\nWho meets, where and when?"
        follow, answer = "What is it about?", f"It is about {record['topic']}."
        if pairs:
            lines.append(json.dumps({"prompt": ask, "response": record["summary"]}))
            continue
        messages = [
            {"role": "system", "content": "You summarise conversations."},
            {"role": "user", "content": ask},
            {"role": "assistant", "content": record["summary"]},
            {"role": "user", "content": follow},
            {"role": "assistant", "content": answer},
        ]
        lines.append(json.dumps({"messages": messages}))
    return publish_text(path, "\n".join(lines) + "\n")


def time_to_first_step(command: list[str], run_dir: Path, env: dict, cwd: Path) -> dict:
    """Seconds from starting `command` to its run's first metrics record, and to its end."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    metrics = run_dir / "metrics.jsonl"
    while process.poll() is None:
        if first is None and metrics.is_file() and metrics.stat().st_size:
            first = time.perf_counter() - started
        time.sleep(POLL_S)
    out = process.stdout.read()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{out[-3000:]}")
    if first is None:
        first = time.perf_counter() - started  # one short step: written just before the end
    return {"first_step_s": round(first, 2), "total_s": round(time.perf_counter() - started, 2)}


def bench(
    output: str | None, records: int, repeats: int, checkout: str | None, workdir: str | None, pairs: bool = False
) -> Path:
    source = Checkout.of(checkout)
    repo = source.repo
    work = Path(workdir or tempfile.mkdtemp(prefix="trainkit-startup-"))
    pairs = pairs or (checkout is not None and not (repo / "training" / "text").is_dir())
    data = write_chat(work / ("pairs.jsonl" if pairs else "chat.jsonl"), records, pairs=pairs)
    env = source.env()
    # --seq-len 512, llama2-tiny's context: its 128 holds no whole conversation (about 500 byte tokens each, their
    # first reply after about 330), and examples are packed whole (training/text/packing.py).
    flags = ["--model", "llama2-tiny", "--dataset", str(data), "--steps", "1", "--nproc", "2", "--seq-len", "512"]
    flags += ["--metrics-port", "0", "--checkpoint-interval", "0"]
    results = {"cold": [], "warm": []}
    for repeat in range(repeats):
        runs = work / f"runs-{repeat}"
        shutil.rmtree(runs, ignore_errors=True)
        for phase in ("cold", "warm"):  # cold: nothing cached; warm: a second run id on the same data
            run_id = f"{phase}-{repeat}"
            command = source.invoke("train", *flags, "--runs-dir", str(runs), "--run-id", run_id)
            results[phase].append(time_to_first_step(command, runs / run_id, env, repo))
            print(f"{phase} {repeat + 1}/{repeats}: {results[phase][-1]}", flush=True)
    record = {
        "what": "invoke bench startup: `invoke train` to the first optimizer step, 2 CPU processes, llama2-tiny",
        "command": " ".join(["invoke", "train", *flags]),
        "records": records,
        "data_format": "prompt-response" if pairs else "chat",
        "dataset_bytes": data.stat().st_size,
        "checkout": source.label(),
        **machine(),
        **{
            phase: {
                "runs": values,
                "first_step_s_median": statistics.median(v["first_step_s"] for v in values),
            }
            for phase, values in results.items()
        },
    }
    key = record["checkout"] + ("-pairs" if pairs else "")
    path = add_record(Path(output or "benchmarks/startup-cpu.json"), key, record)
    if workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return path
