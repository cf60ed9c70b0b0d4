"""Invoke tasks: `invoke --list`. Each task is a few lines over the trainkit library."""

from __future__ import annotations

import functools
import inspect

from invoke import Collection, Exit, task

from training.common.job import BY_KEY, fields_of
from trainkit import commands
from trainkit.cluster import JOBS_NAMESPACE
from trainkit.errors import SpecError
from trainkit.job import REGISTRY
from trainkit.plan import PlanOptions

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
)


def user_errors(function):
    """Invalid input ends the task with its message and exit code 2 (no traceback)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except SpecError as error:
            raise Exit(f"error: {error}", code=2) from None

    return wrapper


def job_options(function, names, extra: dict[str, object]):
    """Give a task one option per job field in `names` (name, help and kind from its declaration in
    training/common/job.py) plus `extra` (name -> default); the body receives them all as keywords."""
    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    helps = {}
    for spec in (BY_KEY[name] for name in names):
        default = False if spec.switch else None
        params.append(inspect.Parameter(spec.key, inspect.Parameter.KEYWORD_ONLY, default=default))
        helps[spec.flag[2:]] = spec.help
        if spec.alias:
            params.append(inspect.Parameter(spec.alias, inspect.Parameter.KEYWORD_ONLY, default=None))
            helps[spec.alias] = f"Alias of {spec.flag}."
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in extra.items()]
    function.__signature__ = inspect.Signature(params)
    return function, helps


def _flags(values: dict, names) -> dict:
    """The job fields among a task's keywords; switches off and unset options mean "not given"."""
    flags = {}
    for name in names:
        spec = BY_KEY[name]
        value = values.get(spec.key)
        if spec.alias and values.get(spec.alias) is not None:
            if value is not None:
                raise SpecError(f"--{spec.alias} is an alias of {spec.flag}; give one of them")
            value = values[spec.alias]
        flags[spec.key] = (value or None) if spec.switch else value  # a switch left off: not given
    return flags


def _train(c, profile="local", dry_run=False, **values):
    """Train a model: validate the job, then run it (local: torchrun here; eks: a PyTorchJob)."""
    code = commands.train(_flags(values, TRAIN_KEYS), profile=profile, dry_run=dry_run)
    if code:
        raise Exit(f"training exited with code {code}", code=code)


_train_body, _train_help = job_options(_train, TRAIN_KEYS, {"profile": "local", "dry_run": False})
train = task(
    help={
        **_train_help,
        "model": f"{BY_KEY['model'].help} One of: {', '.join(REGISTRY)}.",
        "profile": "Profile YAML (trainkit/job/profiles): local (default) or aws.",
        "dry-run": "Print what would run and create nothing: the job as spec.json (local) or the PyTorchJob as "
        "YAML (eks); checks nothing on a cluster.",
    },
    name="train",
)(user_errors(_train_body))


def _plan(c, gpus_per_node=None, mfu=0.40, price_per_hour=0.0, epoch_tokens=100_000_000, json=False, **values):
    """Estimate memory per GPU, step time, tokens/s and cost for a job. Runs nothing, creates nothing."""
    flags = _flags(values, PLAN_FLAGS)
    flags["model"] = flags["model"] or "llama2-7b"
    if gpus_per_node is not None:
        if flags["nproc"] is not None:
            raise SpecError("--gpus-per-node is an alias of --nproc; give one of them")
        flags["nproc"] = gpus_per_node
    options = PlanOptions(mfu=float(mfu), price_per_hour=float(price_per_hour) or None, epoch_tokens=int(epoch_tokens))
    print(commands.plan(flags, options, as_json=json))


_plan_body, _plan_help = job_options(
    _plan,
    PLAN_FLAGS,
    {"gpus_per_node": None, "mfu": 0.40, "price_per_hour": 0.0, "epoch_tokens": 100_000_000, "json": False},
)
plan = task(
    help={
        **_plan_help,
        "model": "Registry name of a language model, e.g. llama2-7b (default: llama2-7b).",
        "instance-type": "AWS instance type (p5.48xlarge, p4d.24xlarge, ...); default p5.48xlarge.",
        "sharding": "FULL_SHARD, HYBRID_SHARD, SHARD_GRAD_OP or NO_SHARD (all four are shown; this one is marked).",
        "global-batch-size": "Sequences per optimizer step (default: recipe, raised to fill every GPU).",
        "gpus-per-node": "Alias of --nproc: GPUs per instance (default: all GPUs of --instance-type).",
        "mfu": "Assumed model FLOPs utilisation for time and cost (default 0.40).",
        "price-per-hour": "USD per instance-hour; default from the price table in trainkit/hardware.py.",
        "epoch-tokens": "Tokens in one epoch, for $ per epoch (default 100M).",
        "json": "Print the plan as JSON.",
    },
    name="plan",
)(user_errors(_plan_body))


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
    "run-id": "The run to act on (default: the newest run: local, else the newest trainkit job on the cluster).",
    "target": "local or eks (default: local when the run is in --runs-dir, else eks).",
    "runs-dir": "Local runs folder (default runs).",
    "namespace": f"EKS: namespace of the jobs (default {JOBS_NAMESPACE}).",
}


@task(help=JOB_HELP)
@user_errors
def status(c, run_id=None, target=None, runs_dir="runs", namespace=None):
    """A run's state: local (its processes, last step, restarts) or on EKS (conditions and pods)."""
    print(commands.status(run_id, target, runs_dir, namespace))


@task(
    help={
        **JOB_HELP,
        "rank": "Show this global rank's lines only (default: the leader's log, rank 0's node).",
        "follow": "Keep printing as the log grows.",
    }
)
@user_errors
def logs(c, run_id=None, target=None, runs_dir="runs", namespace=None, rank=None, follow=False):
    """The leader's log (rank 0), or one rank's lines, of a local run or an EKS job."""
    for line in commands.logs(run_id, target, runs_dir, namespace, None if rank is None else int(rank), follow):
        print(line, flush=True)


@task(help=JOB_HELP)
@user_errors
def stop(c, run_id=None, target=None, runs_dir="runs", namespace=None):
    """Stop a run at a step boundary (local: its processes; EKS: delete its job). Outputs stay; the same
    command or --run-id resumes it."""
    print(commands.stop(run_id, target, runs_dir, namespace))


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
