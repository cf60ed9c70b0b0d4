"""Fault injection and benchmarks (top level): `chaos`, `bench <what>`."""

from __future__ import annotations

from invoke import Exit

from trainkit.cli.options import HELP_WORDS, task, task_help, user_errors

CHAOS_HELP = {
    "scenario": "Comma list of scenarios, or all (see docs/elastic.md): worker-kill, node-kill, ...",
    "rdzv": "Comma list of rendezvous backends or all: c10d, etcd (etcd: a local etcd is started per scenario).",
    "parallel": "Scenarios run at once (1 gives undisturbed timings).",
}
BENCHMARKS = ("elastic", "train", "runs", "startup", "restart")
TRAIN_FLAGS = ("model", "layers", "seq_len", "steps", "nproc", "micro_batch_size", "global_batch_size", "precision")
TRAIN_FLAGS += ("sharding", "activation_checkpointing", "ac_every", "prefetch", "reshard_last_layer", "reduce_dtype")
TRAIN_FLAGS += ("attention", "fused_adamw", "compile")
TRAIN_FLAGS += ("loader_workers", "channels_last", "pin_memory", "persistent_workers", "prefetch_factor")
TRAIN_FLAGS += ("dataset", "init", "weights", "lora_rank", "lora_alpha", "lora_targets")


@task(help={**CHAOS_HELP, "workdir": "Where the runs go (default: a new temporary directory)."})
@user_errors
def chaos(c, scenario="all", rdzv="all", workdir=None, parallel=1):
    """Kill workers, nodes, agents or the rendezvous store of local elastic jobs and report what happened."""
    from trainkit.bench import chaos as harness

    _record, ok = harness.run(scenario, rdzv, workdir, int(parallel))
    if not ok:
        raise Exit("some scenarios did not end as expected (see above)", code=1)


@task(
    positional=["what"],
    help={
        "what": f"Which benchmark: {', '.join(BENCHMARKS)}.",
        **CHAOS_HELP,
        "output": "JSON results file (default: benchmarks/<what>.json; train: benchmarks/<model>-<device>.json; "
        "runs: benchmarks/runs-<device>.json).",
        "only": "runs: the commands to run, comma-separated (default: every one the docs quote, "
        "trainkit/bench/runs.py).",
        "table": "elastic: the generated table file docs/elastic.md includes, rewritten from the results (default "
        "docs/generated/elastic-table.md; '' to leave it).",
        "model": "train, restart: the model, as for invoke train (default llama2-tiny).",
        "layers": "train: decoder layers (fewer than the model's for a short bench of a large one).",
        "seq-len": "train: tokens per sequence.",
        "steps": "train: optimizer steps per run (default 60; the first tenth is not timed).",
        "nproc": "train: processes (default as invoke train: every GPU, else 2).",
        "repeats": "train: trainkit/reference pairs, run alternately (default 3); startup, restart: runs of each.",
        "micro-batch-size": "train: as for invoke train.",
        "global-batch-size": "train: as for invoke train.",
        "precision": "train: as for invoke train (auto, bf16, fp32).",
        "sharding": "train: FULL_SHARD (default) or SHARD_GRAD_OP (the reference is FSDP2 only).",
        "activation-checkpointing": "train: as for invoke train.",
        "ac-every": "train: as for invoke train (trainkit's side; the reference stays plain).",
        "prefetch": "train: as for invoke train (trainkit's side; the reference stays plain).",
        "reshard-last-layer": "train: as for invoke train (trainkit's side; the reference stays plain).",
        "reduce-dtype": "train: as for invoke train (trainkit's side; the reference stays plain).",
        "attention": "train: as for invoke train (trainkit's side; the reference stays plain).",
        "fused-adamw": "train: as for invoke train (trainkit's side; the reference stays plain).",
        "compile": "train: as for invoke train (trainkit's side; the reference stays plain).",
        "loader-workers": "train, vision: as for invoke train (both sides).",
        "dataset": "train: as for invoke train (both sides read it; default `synthetic`: generated dialogues, or a "
        "10-class JPEG tree of a few hundred images for vision; give a larger tree, e.g. from "
        "`invoke data.synthetic-imagenet`, for a vision model's full batch).",
        "channels-last": "train, vision: as for invoke train (trainkit's side; the reference stays plain).",
        "pin-memory": "train, vision: as for invoke train (trainkit's side; the reference stays plain).",
        "persistent-workers": "train, vision: as for invoke train (trainkit's side; the reference stays plain).",
        "prefetch-factor": "train, vision: as for invoke train (trainkit's side; the reference stays plain).",
        "init": "train: as for invoke train (both sides; `pretrained` loads --weights).",
        "weights": "train: as for invoke train (both sides; a local model folder or a hub id).",
        "lora-rank": "train: as for invoke train (both sides: the reference adapts the model with PEFT's "
        "get_peft_model, as its docs have a user do it).",
        "lora-alpha": "train: as for invoke train (both sides).",
        "lora-targets": "train: as for invoke train (both sides; the reference's default is PEFT's all-linear).",
        "workdir": "train, runs, startup, restart: where the runs go (default: a new temporary directory).",
        "records": "startup: chat conversations in the generated dataset (default 100000).",
        "pairs": "startup: write the conversations as prompt/response records (what a checkout before chat reads).",
        "checkout": "startup, restart: time another trainkit checkout (e.g. a worktree of an older commit) instead of "
        "this one.",
    },
)
@user_errors
def bench(
    c,
    what,
    output=None,
    table=None,
    scenario="all",
    rdzv="all",
    parallel=1,
    model="llama2-tiny",
    layers=None,
    seq_len=None,
    steps=60,
    nproc=None,
    repeats=3,
    micro_batch_size=None,
    global_batch_size=None,
    precision=None,
    sharding=None,
    activation_checkpointing=False,
    ac_every=None,
    prefetch=None,
    reshard_last_layer=None,
    reduce_dtype=None,
    attention=None,
    fused_adamw=None,
    compile=None,  # noqa: A002 - the flag's name
    loader_workers=None,
    channels_last=None,
    pin_memory=None,
    persistent_workers=None,
    prefetch_factor=None,
    dataset=None,
    init=None,
    weights=None,
    lora_rank=None,
    lora_alpha=None,
    lora_targets=None,
    workdir=None,
    only=None,
    records=100_000,
    checkout=None,
    pairs=False,
):
    """Run a benchmark and write its results file. elastic: recovery from every fault on both backends. train:
    trainkit's throughput against a bare FSDP2 loop (vision: DDP, and the JPEG pipeline against on-device input)
    on the same job, with MFU and a step-time breakdown. runs: the commands the docs quote, each run once (time,
    rates, bytes written), which the docs' figures are rendered from. startup: `invoke train` to the first step on
    a large chat dataset, tokenised cache cold and warm. restart: a rank's worker SIGKILLed mid-run to the next
    step of a 2-process run of --model."""
    from trainkit.bench import chaos as harness

    if what in HELP_WORDS:  # `invoke bench --help`: the positional took the word
        print(task_help(bench))
        return
    if what not in BENCHMARKS:
        raise Exit(f"error: unknown benchmark {what!r}; choose one of: {', '.join(BENCHMARKS)}", code=2)
    if what == "train":
        from trainkit.bench import train as benchtrain

        given = {key: value for key, value in locals().items() if key in TRAIN_FLAGS and value not in (None, False)}
        flags = []
        for key, value in given.items():
            flags += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
        benchtrain.stop_on_sigterm()
        _path, lines = benchtrain.bench(flags, int(repeats), output, workdir)
        print("\n".join(lines))
        return
    if what == "startup":
        from trainkit.bench import startup

        path = startup.bench(output, int(records), int(repeats), checkout, workdir, bool(pairs))
        print(f"wrote {path}")
        return
    if what == "restart":
        from trainkit.bench import restart

        print(f"wrote {restart.bench(output, model, int(repeats), checkout, workdir)}")
        return
    if what == "runs":
        from trainkit.bench import runs as benchruns
        from trainkit.bench.train import stop_on_sigterm

        stop_on_sigterm()
        path, _record = benchruns.bench(output, only.split(",") if only else None, workdir)
        print(f"wrote {path}; `make docs` renders the pages' figures from it")
        return
    output = output or f"benchmarks/{what}.json"
    if not harness.bench(output, harness.TABLE_FILE if table is None else table or None, scenario, rdzv, int(parallel)):
        raise Exit("some scenarios did not end as expected (see above)", code=1)


TASKS = (chaos, bench)
