"""Invoke tasks: `invoke --list`. Each task is a few lines over the trainkit library."""

from __future__ import annotations

import functools

from invoke import Collection, Exit, task

from training.common.cli import field_docs
from trainkit import commands
from trainkit.cluster import JOBS_NAMESPACE
from trainkit.errors import SpecError
from trainkit.plan import PlanInputs
from trainkit.spec import JobSpec, parse_bool

TRAIN_FLAGS = [
    "model",
    "init",
    "weights",
    "layers",
    "dataset",
    "dataset_split",
    "steps",
    "epochs",
    "global_batch_size",
    "micro_batch_size",
    "seq_len",
    "lr",
    "schedule",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "image_size",
    "optimizer",
    "label_smoothing",
    "loader_workers",
    "synthetic",
    "warmup_epochs",
    "sharding",
    "precision",
    "activation_checkpointing",
    "checkpoint_interval",
    "keep_checkpoints",
    "log_interval",
    "nodes",
    "max_restarts",
    "collective_timeout",
    "nproc",
    "rdzv",
    "rdzv_endpoint",
    "target",
    "instance_type",
    "image",
    "namespace",
    "seed",
    "peak_tflops",
    "metrics_port",
    "run_id",
    "runs_dir",
    "hf_token_file",
]


SPEC_HELP = {name.replace("_", "-"): doc for name, doc in field_docs(JobSpec).items() if name in TRAIN_FLAGS}


def user_errors(function):
    """Invalid input ends the task with its message and exit code 2 (no traceback)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except SpecError as error:
            raise Exit(f"error: {error}", code=2) from None

    return wrapper


@task(
    help={
        **SPEC_HELP,
        "profile": "Profile YAML under trainkit/profiles (default: local).",
        "data": "Alias of --dataset, e.g. an ImageFolder root with train/ and val/ for vision models.",
        "synthetic": SPEC_HELP["synthetic"],
        "dry-run": "EKS: print the PyTorchJob as YAML; check nothing on the cluster, create nothing.",
    }
)
@user_errors
def train(
    c,
    model="llama2-tiny",
    profile="local",
    init=None,
    weights=None,
    layers=None,
    dataset=None,
    data=None,
    dataset_split=None,
    steps=None,
    epochs=None,
    global_batch_size=None,
    micro_batch_size=None,
    seq_len=None,
    lr=None,
    schedule=None,
    warmup_steps=None,
    weight_decay=None,
    grad_clip=None,
    image_size=None,
    optimizer=None,
    label_smoothing=None,
    loader_workers=None,
    synthetic=False,
    warmup_epochs=None,
    sharding=None,
    precision=None,
    activation_checkpointing=None,
    checkpoint_interval=None,
    keep_checkpoints=None,
    log_interval=None,
    nodes=None,
    max_restarts=None,
    collective_timeout=None,
    nproc=None,
    rdzv=None,
    rdzv_endpoint=None,
    target=None,
    instance_type=None,
    image=None,
    namespace=None,
    seed=None,
    peak_tflops=None,
    metrics_port=None,
    run_id=None,
    runs_dir=None,
    hf_token_file=None,
    dry_run=False,
):
    """Train a model: validate the job spec, then run it (local: torchrun here; eks: a PyTorchJob)."""
    if data is not None and dataset is not None:
        raise Exit("error: --data is an alias of --dataset; give one of them", code=2)
    values = dict(locals(), dataset=data if data is not None else dataset, synthetic=synthetic or None)
    code = commands.train({name: values[name] for name in TRAIN_FLAGS}, profile=profile, dry_run=dry_run)
    if code:
        raise Exit(f"training exited with code {code}", code=code)


@task(
    help={
        "model": "Registry name, e.g. llama2-7b.",
        "nodes": "Number of instances.",
        "gpus-per-node": "GPUs per instance (default: all GPUs of --instance-type).",
        "instance-type": "AWS instance type (p5.48xlarge, p4d.24xlarge, ...).",
        "sharding": "FULL_SHARD, HYBRID_SHARD, SHARD_GRAD_OP or NO_SHARD (all four are shown; this one is marked).",
        "seq-len": "Tokens per sequence (default: model recipe).",
        "micro-batch-size": "Sequences per GPU per forward pass (default: model recipe).",
        "global-batch-size": "Sequences per optimizer step (default: recipe, raised to fill every GPU).",
        "activation-checkpointing": "true/false (default: model recipe).",
        "mfu": "Assumed model FLOPs utilisation for time and cost (default 0.40).",
        "price-per-hour": "USD per instance-hour; default from the price table in trainkit/hardware.py.",
        "epoch-tokens": "Tokens in one epoch, for $ per epoch (default 100M).",
        "layers": "Plan for a model truncated to this many layers.",
        "json": "Print the plan as JSON.",
    }
)
@user_errors
def plan(
    c,
    model="llama2-7b",
    nodes=1,
    gpus_per_node=0,
    instance_type="p5.48xlarge",
    sharding="FULL_SHARD",
    seq_len=0,
    micro_batch_size=0,
    global_batch_size=0,
    activation_checkpointing="",
    mfu=0.40,
    price_per_hour=0.0,
    epoch_tokens=100_000_000,
    layers=0,
    json=False,
):
    """Estimate memory per GPU, step time, tokens/s and cost for a job. Runs nothing, creates nothing."""
    checkpointing = (
        parse_bool("--activation-checkpointing", activation_checkpointing) if activation_checkpointing else None
    )
    inputs = PlanInputs(
        model=model,
        nodes=nodes,
        gpus_per_node=gpus_per_node or None,
        instance_type=instance_type,
        sharding=sharding,
        seq_len=seq_len or None,
        micro_batch_size=micro_batch_size or None,
        global_batch_size=global_batch_size or None,
        activation_checkpointing=checkpointing,
        mfu=mfu,
        price_per_hour=price_per_hour or None,
        epoch_tokens=epoch_tokens,
        layers=layers or None,
    )
    print(commands.plan(inputs, as_json=json))


INFRA_HELP = {
    "profile": "local (this machine) or aws (Terraform infra stack, then the platform stack).",
    "yes": "Do not ask for confirmation (aws).",
    "var-file": "tfvars for the infra stack (default terraform/stacks/infra/terraform.tfvars).",
}


@task(
    help={**INFRA_HELP, "stack": "aws: all (default), infra (cluster, nodes, FSx, ECR) or platform (on the cluster)."}
)
@user_errors
def up(c, profile="local", yes=False, var_file=None, stack="all"):
    """Bring up a profile. aws: plan, cost per hour, confirm, apply infra, write a kubeconfig, apply the platform."""
    print(commands.up(profile, yes=yes, var_file=var_file, stack=stack))


@task(help=INFRA_HELP)
@user_errors
def down(c, profile="local", yes=False, var_file=None):
    """Take a profile down. aws: destroy in order, then audit that nothing tagged is left (exit 2 if so)."""
    print(commands.down(profile, yes=yes, var_file=var_file))


@task(name="plan", help={"var-file": INFRA_HELP["var-file"]})
@user_errors
def infra_plan(c, var_file=None):
    """Show what `infra.up --profile aws` would create and its GPU cost per hour. Changes nothing."""
    print(commands.aws_plan(var_file))


@task
@user_errors
def outputs(c):
    """Print the infra stack's outputs (cluster, FSx, ECR, GPU shape) as JSON."""
    print(commands.aws_outputs())


@task(help={"var-file": INFRA_HELP["var-file"]})
@user_errors
def audit(c, var_file=None):
    """List AWS resources still tagged with the stack id; exit 2 when any are left."""
    print(commands.aws_audit(var_file))


@task(
    help={
        "dest": "Destination directory, the ImageFolder root (on EKS: a path on the FSx volume).",
        "source": "s3://bucket/prefix/ holding train/<wnid>/, val/ (and LOC_val_solution.csv). Without it, only "
        "re-lay out and check --dest.",
        "val-csv": "LOC_val_solution.csv (local path or s3:// URL); default: the one at the source root or in --dest.",
        "workers": "Parallel downloads (default 32).",
    }
)
@user_errors
def imagenet(c, dest, source=None, val_csv=None, workers=32):
    """Copy ImageNet from S3 (parallel, resumable, retried), put val/ images into class folders, check the tree."""
    for line in commands.data_imagenet(dest, source, val_csv, workers):
        print(line)


@task(
    name="synthetic-imagenet",
    help={
        "dest": "Directory to create (must not exist, or be empty).",
        "classes": "Number of classes (default 10).",
        "per-class": "Training JPEGs per class (default 40).",
        "val-per-class": "Validation JPEGs per class (default 10).",
        "size": "Image side in pixels (default 40).",
        "seed": "Seed; the same settings always give the same images.",
        "flat-val": "Write val/ flat with LOC_val_solution.csv, as ILSVRC ships it.",
    },
)
@user_errors
def synthetic_imagenet(c, dest, classes=10, per_class=40, val_per_class=10, size=40, seed=0, flat_val=False):
    """Write a small real-JPEG ImageNet-layout tree (train/<wnid>/, val/<wnid>/) for tests and the local demo."""
    print(
        commands.data_synthetic_imagenet(
            dest,
            classes=classes,
            per_class=per_class,
            val_per_class=val_per_class,
            size=size,
            seed=seed,
            flat_val=flat_val,
        )
    )


CHAOS_HELP = {
    "scenario": "Comma list of scenarios, or all (see README, Elastic training): worker-kill, node-kill, ...",
    "rdzv": "Comma list of rendezvous backends or all: c10d, etcd (etcd: a local etcd is started per scenario).",
    "parallel": "Scenarios run at once (1 gives undisturbed timings).",
}


@task(help={**CHAOS_HELP, "workdir": "Where the runs go (default: a new temporary directory)."})
@user_errors
def chaos(c, scenario="all", rdzv="all", workdir=None, parallel=1):
    """Kill workers, nodes, agents or the rendezvous store of local elastic jobs and report what happened."""
    _record, ok = commands.chaos(scenario, rdzv, workdir, int(parallel))
    if not ok:
        raise Exit("some scenarios did not end as expected (see above)", code=1)


BENCHMARKS = ("elastic",)


@task(
    positional=["what"],
    help={
        "what": f"Which benchmark: {', '.join(BENCHMARKS)}.",
        **CHAOS_HELP,
        "output": "JSON results file (default: benchmarks/<what>.json).",
        "readme": "README whose table is rewritten from the results ('' to leave it).",
    },
)
@user_errors
def bench(c, what, output=None, readme="README.md", scenario="all", rdzv="all", parallel=1):
    """Run a benchmark and write its results file. elastic: recovery from every fault on both backends."""
    if what not in BENCHMARKS:
        raise Exit(f"error: unknown benchmark {what!r}; choose one of: {', '.join(BENCHMARKS)}", code=2)
    output = output or f"benchmarks/{what}.json"
    if not commands.bench_elastic(output, readme or None, scenario, rdzv, int(parallel)):
        raise Exit("some scenarios did not end as expected (see above)", code=1)


JOB_HELP = {
    "run-id": "The run to act on (default: the newest trainkit job in the namespace).",
    "namespace": f"Namespace of the jobs (default {JOBS_NAMESPACE}).",
}


@task(help=JOB_HELP)
@user_errors
def status(c, run_id=None, namespace=JOBS_NAMESPACE):
    """EKS: a job's conditions and its pods (phase, restarts, node)."""
    from trainkit.backends import eks

    print(eks.status(namespace, run_id))


@task(
    help={
        **JOB_HELP,
        "rank": "Show this global rank's lines only (default: the whole log of the leader, group rank 0).",
        "follow": "Keep printing as the log grows.",
    }
)
@user_errors
def logs(c, run_id=None, namespace=JOBS_NAMESPACE, rank=None, follow=False):
    """EKS: the leader's log (the pod holding rank 0), or one rank's lines."""
    from trainkit.backends import eks

    eks.print_lines(eks.logs(namespace, run_id, None if rank is None else int(rank), follow))


@task(help=JOB_HELP)
@user_errors
def stop(c, run_id=None, namespace=JOBS_NAMESPACE):
    """EKS: delete a run's job; its outputs on FSx stay (submit the same --run-id to resume)."""
    from trainkit.backends import eks

    print(eks.stop(namespace, run_id))


@task(
    name="hf-token",
    help={
        "file": "File holding the token (default: HF_TOKEN, the Hugging Face CLI's token file, else a hidden prompt).",
        "namespace": JOB_HELP["namespace"],
    },
)
@user_errors
def hf_token(c, file=None, namespace=JOBS_NAMESPACE):
    """Store your Hugging Face token as the cluster Secret the training pods read (never on a command line)."""
    print(commands.hf_token_secret(file, namespace))


@task(
    name="generate",
    help={"check": "Change nothing; exit 1 and name the files that regenerating would change."},
)
def obs_generate(c, check=False):
    """Regenerate observability/generated/ (dashboards JSON, alert rules) from observability/*.py."""
    from observability import generate

    code = generate.main(["--check"] if check else [])
    if code:
        raise Exit(code=code)


@task(
    help={
        "run": "The run id (its folder under --runs-dir).",
        "runs-dir": "Where runs live (default runs); other runs of the model there give the scaling panel.",
        "output": "PNG to write (default <runs-dir>/<run>/report.png).",
    }
)
@user_errors
def report(c, run, runs_dir="runs", output=None):
    """One PNG of a run: loss, throughput and MFU over steps; scaling against ideal across world sizes."""
    print(commands.obs_report(run, runs_dir, output))


@task(
    help={
        "port": "Local port for Grafana (default 3000).",
        "kubeconfig": "kubeconfig of the cluster (default the one `make up PROFILE=aws` wrote).",
    }
)
@user_errors
def grafana(c, port=3000, kubeconfig=None):
    """EKS: port-forward the platform's Grafana, print its URL and where its login comes from. Ctrl-C ends it."""
    raise Exit(code=commands.obs_grafana(int(port), kubeconfig))


infra = Collection("infra", up, down, infra_plan, outputs, audit)
obs = Collection("obs", obs_generate, report, grafana)
secrets = Collection("secrets", hf_token)
data = Collection("data", imagenet, synthetic_imagenet)
namespace = Collection(train, plan, status, logs, stop, chaos, bench, infra, data, secrets, obs)
