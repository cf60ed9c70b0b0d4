"""The job's doors (top level): `train`, `plan`, and `status` / `logs` / `stop` of a run on any backend."""

from __future__ import annotations

from json import dumps
from pathlib import Path

from training.registry import DECODER_TYPES
from training.spec import by_key, fields_of
from trainkit.backends import RunRef, backend_of, resolve_job
from trainkit.backends.eks.cluster import JOBS_NAMESPACE
from trainkit.cli.options import job_flags, job_options, task, user_errors
from trainkit.errors import SpecError
from trainkit.job import REGISTRY, build, get_model
from trainkit.plan.memory import PlanOptions, make_plan
from trainkit.plan.scaling import (
    make_scaling,
    published_job_on,
    published_llm_curves,
    render_scaling,
    scaling_json,
    scaling_png,
)
from trainkit.plan.shown import plan_json, render_plan
from trainkit.workloads.recipe import recipe

TRAIN_KEYS = [spec.key for spec in fields_of(cli=True)]
PLAN_FLAGS = (
    "model",
    "layers",
    "seq_len",
    "nodes",
    "nproc",
    "sharding",
    "activation_checkpointing",
    "micro_batch_size",
    "global_batch_size",
    "instance_type",
    "lora_rank",
    "lora_targets",
    "target",
    "spot",
)


def _train(c, profile="local", dry_run=False, **values):
    """Train a model: validate the job, then run it (local: torchrun here; eks: a PyTorchJob)."""
    job, backend, _ = resolve_job(job_flags(values, TRAIN_KEYS), profile)
    backend.submit(job, recipe(job), dry_run=dry_run)  # a failed run raises JobFailed: its cause, its exit code


_train_body, _train_help = job_options(_train, TRAIN_KEYS, {"profile": "local", "dry_run": False})
train = task(
    help={
        **_train_help,
        "model": f"{by_key()['model'].help} Registry names: {', '.join(REGISTRY)}. Causal LM types trainkit sizes "
        f"and trains: {', '.join(DECODER_TYPES)}.",
        "profile": "Profile YAML (trainkit/job/profiles): local (default) or aws.",
        "dry-run": "Print what would run and create nothing: the job as spec.json (local), the PyTorchJob as "
        "YAML (eks), the CreateTrainingJob request (sagemaker), the RegisterJobDefinition and SubmitJob requests "
        "(batch); checks nothing on a cluster.",
    },
    name="train",
)(user_errors(_train_body))


def _plan(
    c,
    gpus_per_node=None,
    mfu=None,
    price_per_hour=0.0,
    epoch_tokens=100_000_000,
    json=False,
    scaling=False,
    published=False,
    output=None,
    **values,
):
    """Estimate memory per GPU, step time, tokens/s and cost for a job; --scaling: on 1..64 nodes for every
    strategy; --published: the scaling model beside published tables. Runs nothing, creates nothing in the cloud."""
    if published:
        from trainkit.plan.published import published_report

        print(published_report(published_llm_curves, published_job_on))
        return
    flags = job_flags(values, PLAN_FLAGS)
    flags["model"] = flags["model"] or "llama2-7b"
    if gpus_per_node is not None:
        if flags["nproc"] is not None:
            raise SpecError("--gpus-per-node is an alias of --nproc; give one of them")
        flags["nproc"] = gpus_per_node
    try:
        price, tokens = float(price_per_hour), int(epoch_tokens)
        utilisation = None if mfu is None else float(mfu)
    except ValueError as error:
        raise SpecError(f"--mfu, --price-per-hour and --epoch-tokens take numbers ({error})") from None
    options = PlanOptions(mfu=utilisation, price_per_hour=price if price != 0 else None, epoch_tokens=tokens)
    job = build(flags)  # the same fields and checks as `invoke train`
    if scaling:
        result = make_scaling(job, options)
        label = get_model(job.model.name).label  # a folder or hub id's last part: no slashes in the file name
        base = Path(output or f"runs/plan/scaling-{label}-{result.plan.job.placement.instance_type}")
        png, table = base.parent / f"{base.name}.png", base.parent / f"{base.name}.json"
        try:
            base.parent.mkdir(parents=True, exist_ok=True)
            table.write_text(dumps(scaling_json(result), indent=2) + "\n")
            scaling_png(result, png)
        except OSError as error:
            raise SpecError(f"--output {base}: cannot write there ({error.strerror}); give a writable path") from None
        print(render_scaling(result))
        print(f"\n  wrote {png} and {table}")
        return
    result = make_plan(job, options)
    print(plan_json(result) if json else render_plan(result))


_plan_body, _plan_help = job_options(
    _plan,
    PLAN_FLAGS,
    {
        "gpus_per_node": None,
        "mfu": None,
        "price_per_hour": 0.0,
        "epoch_tokens": 100_000_000,
        "json": False,
        "scaling": False,
        "published": False,
        "output": None,
    },
)
plan = task(
    help={
        **_plan_help,
        "model": "Registry name of a language model, e.g. llama2-7b or bert-1.5b (default: llama2-7b); or a Hugging "
        "Face causal LM: a hub id (owner/name), a local model folder or its config.json.",
        "instance-type": "AWS instance type (p5.48xlarge, p4d.24xlarge, ...); default p5.48xlarge.",
        "sharding": "Decoders: FULL_SHARD, HYBRID_SHARD, SHARD_GRAD_OP or NO_SHARD; BERT: ZERO_1 or NO_SHARD (every "
        "strategy of the family is shown; this one is marked; default: the recipe's).",
        "global-batch-size": "Sequences per optimizer step (default: recipe, raised to fill every GPU).",
        "gpus-per-node": "Alias of --nproc: GPUs per instance (default: all GPUs of --instance-type).",
        "mfu": "Model FLOPs utilisation for time and cost (default: the median of benchmarks/<model>-<gpu>.json "
        "from invoke bench train when it exists, else 0.40).",
        "price-per-hour": "USD per instance-hour (default: today's for --target in the plan's region, from the AWS "
        "Price List API with credentials, else the dated table trainkit/tables/prices.json; docs/cost.md).",
        "epoch-tokens": "Tokens in one epoch, for $ per epoch (default 100M).",
        "json": "Print the plan as JSON.",
        "scaling": "Predict step time, tokens/s and efficiency on 1..64 nodes for every strategy and choose one "
        "(trainkit/plan/scaling_model.py); writes a PNG and JSON.",
        "published": "Print the scaling model's predictions beside the published tables it is held against, and "
        "the DL1 BERT 1.5B anchor beside the same job predicted on p4d and p5.",
        "output": "--scaling: path of the PNG and JSON without suffix (default runs/plan/scaling-<model>-<instance>).",
    },
    name="plan",
)(user_errors(_plan_body))


RUN_HELP = {
    "run-id": "The run to act on (default: the newest run: local, else the newest trainkit job on the cluster).",
    "target": "local, eks, sagemaker or batch (default: local when the run is in --runs-dir, else sagemaker or batch "
    "when this machine submitted it there, the later of the two, else eks).",
    "runs-dir": "Local runs folder (default runs).",
    "namespace": f"EKS: namespace of the jobs (default {JOBS_NAMESPACE}).",
}


@task(help=RUN_HELP)
@user_errors
def status(c, run_id=None, target=None, runs_dir="runs", namespace=None):
    """A run's state: local (its processes, last step, restarts), on EKS (conditions and pods), on SageMaker
    (status transitions, failure reason, billable time) or on Batch (attempts, nodes, the main node's cause)."""
    print(backend_of(run_id, target, runs_dir).status(RunRef(run_id, runs_dir, namespace)))


@task(
    short={"follow": "f"},
    help={
        **RUN_HELP,
        "rank": "Show this global rank's lines only (default: the leader's log, rank 0's node).",
        "follow": "Keep printing as the log grows.",
    },
)
@user_errors
def logs(c, run_id=None, target=None, runs_dir="runs", namespace=None, rank=None, follow=False):
    """The leader's log (rank 0), or one rank's lines, of a local run, an EKS, SageMaker or Batch job."""
    run = RunRef(run_id, runs_dir, namespace)
    for line in backend_of(run_id, target, runs_dir).logs(run, None if rank is None else int(rank), follow):
        print(line, flush=True)


@task(help=RUN_HELP)
@user_errors
def stop(c, run_id=None, target=None, runs_dir="runs", namespace=None):
    """Stop a run at a step boundary (local: its processes; EKS, SageMaker, Batch: its job); outputs stay, re-running
    resumes."""
    print(backend_of(run_id, target, runs_dir).stop(RunRef(run_id, runs_dir, namespace)))


TASKS = (train, plan, status, logs, stop)
