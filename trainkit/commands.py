"""What the Invoke tasks do, as plain functions (tasks.py stays a thin layer of flags and help)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from training.common.job import SPEC_FILE

from .backends import Backend, RunRef, get_backend, resolve_job
from .backends.local import machine
from .cluster import kubeconfig_path, outputs_path, save_outputs
from .errors import SpecError
from .job import build
from .plan import PlanOptions, make_plan, render_plan


def train(flags: dict[str, Any], profile: str = "local", dry_run: bool = False) -> int:
    """Resolve and validate the job, then submit it to its backend (local: prepare the run folder and run
    torchrun here; eks: preflight, then a PyTorchJob). Returns the job's exit code (eks: 0 once submitted)."""
    job, backend = resolve_job(flags, profile)
    return backend.submit(job, dry_run=dry_run)


def _backend_of(run_id: str | None, target: str | None, runs_dir: str) -> Backend:
    """The backend that holds a run: --target, else local when the run (or, without --run-id, any run)
    is in the local runs folder, else EKS."""
    if target is None:
        runs = Path(runs_dir)
        local = (runs / run_id / SPEC_FILE).is_file() if run_id else any(runs.glob(f"*/{SPEC_FILE}"))
        target = "local" if local else "eks"
    return get_backend(target)


def status(run_id: str | None, target: str | None, runs_dir: str, namespace: str | None) -> str:
    return _backend_of(run_id, target, runs_dir).status(RunRef(run_id, runs_dir, namespace))


def logs(run_id, target, runs_dir, namespace, rank: int | None, follow: bool) -> Iterator[str]:
    return _backend_of(run_id, target, runs_dir).logs(RunRef(run_id, runs_dir, namespace), rank, follow)


def stop(run_id: str | None, target: str | None, runs_dir: str, namespace: str | None) -> str:
    return _backend_of(run_id, target, runs_dir).stop(RunRef(run_id, runs_dir, namespace))


def data_imagenet(dest: str, source: str | None, val_csv: str | None, workers: int) -> list[str]:
    """Copy from S3 (when a source is given), re-lay out val/, check the tree."""
    from training.vision.layout import LayoutError
    from training.vision.prep import PrepError, prepare_imagenet

    if workers < 1:
        raise SpecError(f"--workers must be a positive integer (got {workers})")
    try:
        return prepare_imagenet(dest, source, val_csv, workers)
    except (PrepError, LayoutError) as error:
        raise SpecError(str(error)) from None


def data_synthetic_imagenet(dest: str, **settings: Any) -> str:
    from training.vision.layout import LayoutError, check_image_folder
    from training.vision.synthetic import SyntheticTree, write_tree

    try:
        tree = SyntheticTree(**settings)
        root = write_tree(dest, tree)
        if tree.flat_val:
            return f"wrote {root} with a flat val/ and its label CSV; lay it out: invoke data.imagenet --dest {root}"
        classes = check_image_folder(root, flag="--dest")
    except LayoutError as error:
        raise SpecError(str(error)) from None
    images = tree.classes * (tree.per_class + tree.val_per_class)
    return (
        f"wrote {root}: {len(classes)} classes, {images} JPEGs of {tree.size}px -> "
        f"invoke train --model resnet-tiny --data {root}"
    )


def plan(flags: dict[str, Any], options: PlanOptions, as_json: bool = False) -> str:
    """The estimate for the job these flags describe (the same fields and checks as `invoke train`)."""
    result = make_plan(build(flags), options)
    if as_json:
        data = asdict(result)
        for name, breakdown in result.memory_per_gpu.items():
            data["memory_per_gpu"][name]["total"] = breakdown.total
        return json.dumps(data, indent=2)
    return render_plan(result)


INFRA_PROFILES = ("local", "aws")


def _infra_profile(profile: str) -> str:
    if profile not in INFRA_PROFILES:
        raise SpecError(f"--profile {profile!r} is not valid here; choose one of: {', '.join(INFRA_PROFILES)}")
    return profile


STACKS = ("all", "infra", "platform")


def up(profile: str, yes: bool = False, var_file: str | None = None, stack: str = "all") -> str:
    """local: start the local etcd (for --rdzv etcd), report this machine. aws: plan, show cost, confirm,
    apply the infra stack (and write a kubeconfig), then the platform stack."""
    if stack not in STACKS:
        raise SpecError(f"--stack {stack!r} is not valid; choose one of: {', '.join(STACKS)}")
    if _infra_profile(profile) == "aws":
        return aws_up(yes, var_file, stack)
    import importlib.util

    from .services import LocalEtcd, LocalGpuExporter, LocalPrometheus

    here = machine()
    limit, what = here.process_limit, here.described
    torch_ok = importlib.util.find_spec("torch") is not None
    etcd = _start_local("etcd", LocalEtcd().up, "for --rdzv etcd; state in .trainkit/etcd")
    prometheus = LocalPrometheus()
    metrics = _start_local("prometheus", prometheus.up, "scrapes local ranks; state in .trainkit/prometheus")
    if prometheus.endpoint() is None:
        gpus = "not started: Prometheus is not running"
    else:
        served = LocalGpuExporter().serve(prometheus.root)
        gpus = (
            f"running on {served[0]} ({served[1]})"
            if served
            else "none: no NVIDIA GPU or EFA device (GPU panels: no data)"
        )
    return "\n".join(
        [
            f"{profile} profile: jobs run as processes on this machine; c10d rendezvous needs no server.",
            f"  capacity      {what} -> up to {limit} training process(es)",
            f"  torch         {'installed' if torch_ok else 'MISSING: run make setup'}",
            f"  etcd          {etcd}",
            f"  prometheus    {metrics}",
            f"  gpu exporter  {gpus}",
        ]
    )


def _start_local(name: str, start, what: str) -> str:
    """Start one local server; a missing binary is reported, not fatal (c10d training needs neither)."""
    try:
        endpoint, started = start()
    except SpecError as error:
        return f"not started: {error}"
    return f"{'started' if started else 'running'} on {endpoint} ({what})"


def down(profile: str, yes: bool = False, var_file: str | None = None) -> str:
    if _infra_profile(profile) == "aws":
        return aws_down(yes, var_file)
    from .services import LocalEtcd, LocalGpuExporter, LocalPrometheus

    stopped = [
        name
        for name, server in (
            ("etcd", LocalEtcd()),
            ("prometheus", LocalPrometheus()),
            ("gpu exporter", LocalGpuExporter()),
        )
        if server.down()
    ]
    servers = f"stopped {', '.join(stopped)}" if stopped else "no local servers were running"
    return f"{profile} profile: {servers} (etcd data removed; Prometheus data kept); run outputs under runs/ are kept."


def _plan_infra(var_file: str | None):
    """Checks that need no Terraform first (tfvars, credentials), then a saved plan of the infra stack."""
    from .infra import aws

    path = aws.resolve_var_file(var_file)
    aws.check_credentials()
    stack = aws.stack()
    stack.init()
    plan = stack.plan(path)
    return stack, plan, f"{plan.describe()}\n{aws.estimate_cost(plan).describe()}"


def aws_plan(var_file: str | None = None) -> str:
    return _plan_infra(var_file)[2]


def aws_up(yes: bool, var_file: str | None, which: str = "all") -> str:
    from .infra import aws

    if which in ("all", "infra"):
        stack, plan, summary = _plan_infra(var_file)
        print(summary, flush=True)
        if plan.has_changes:
            aws.confirm("Create these resources (they are billed until `make down PROFILE=aws`)?", yes)
            stack.apply(plan)
    else:
        stack = aws.stack()
        stack.init()
    outputs = stack.outputs()
    if not outputs:
        raise SpecError("the infra stack has no outputs yet: run `make up PROFILE=aws` (both stacks) first")
    save_outputs(outputs)  # what `invoke train --target eks` defaults from (instance type, ECR image)
    kubeconfig = aws.write_kubeconfig(outputs, kubeconfig_path())
    if which in ("all", "platform"):
        # Device plugins, training operator, etcd, FSx claim (terraform/stacks/platform); its
        # providers (helm, kubernetes, kustomization) come from the registry.
        platform = aws.stack("platform")
        platform.init()
        plan = platform.plan()
        if plan.has_changes:
            platform.apply(plan)
    return f"cluster {outputs['cluster_name']} is up; kubeconfig: export KUBECONFIG={kubeconfig}"


def aws_down(yes: bool, var_file: str | None) -> str:
    """Destroy in order (platform stack first once it exists, then infra), then audit by tag."""
    from .infra import aws

    path = aws.resolve_var_file(var_file)
    aws.check_credentials()
    stack_id, region, name = aws.stack_identity(path)
    confirmed = False
    for stack_name in aws.teardown_order():
        stack = aws.stack(stack_name)
        if not (stack.state_dir / "terraform.tfstate").is_file():
            continue  # never applied (and its providers need not be installed to know it)
        stack.init()
        if not stack.has_state():
            continue
        if not confirmed:
            aws.confirm(f"Destroy everything in stack {stack_id} (cluster, GPU nodes, FSx data)?", yes)
            confirmed = True
        print(f"destroying the {stack_name} stack", flush=True)
        stack.destroy(path if stack_name == "infra" else None)  # the platform stack reads infra outputs
    leftovers = aws.audit(stack_id, region, name)
    kubeconfig_path().unlink(missing_ok=True)
    outputs_path().unlink(missing_ok=True)
    if leftovers:
        raise SpecError("teardown left billable resources behind:\n  " + "\n  ".join(leftovers))
    return f"stack {stack_id} destroyed; audit of {region} found nothing tagged {aws.STACK_TAG}={stack_id}"


def aws_outputs() -> str:
    from .infra import aws

    stack = aws.stack()
    stack.init()
    return json.dumps(stack.outputs(), indent=2)


def aws_audit(var_file: str | None = None) -> str:
    from .infra import aws

    path = aws.resolve_var_file(var_file)
    aws.check_credentials()
    leftovers = aws.audit(*aws.stack_identity(path))
    if leftovers:
        raise SpecError("resources still tagged for this stack:\n  " + "\n  ".join(leftovers))
    return "audit: nothing left"


def chaos(scenarios: str, backends: str, workdir: str | None, parallel: int) -> tuple[dict, bool]:
    """Run fault-injection scenarios on local elastic jobs; (benchmark record, every outcome as expected)."""
    import shutil
    import tempfile
    from pathlib import Path

    from . import chaos as harness

    pairs = harness.select(scenarios, backends)
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="trainkit-chaos-"))
    print(f"{len(pairs)} scenario(s); runs under {root}", flush=True)
    record = harness.run_matrix(pairs, root, parallel=parallel, report=lambda line: print(line, flush=True))
    ok = all(result["ok"] for result in record["results"])
    if workdir is None:
        # A temporary folder of a matrix that went as expected holds nothing to read (~1.7 GB of
        # checkpoints and etcd data); one with a surprise is kept for its logs.
        if ok:
            shutil.rmtree(root, ignore_errors=True)
            print(f"all as expected: removed {root}", flush=True)
        else:
            print(f"runs kept for their logs: {root}", flush=True)
    return record, ok


def bench_elastic(output: str, readme: str | None, scenarios: str, backends: str, parallel: int) -> bool:
    """`chaos` over the matrix, written to `output` (JSON) and the README's table; True when all as expected."""
    from pathlib import Path

    from . import chaos as harness

    record, ok = chaos(scenarios, backends, None, parallel)
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    if readme:
        harness.update_readme(Path(readme), record)
        print(f"updated the elastic table in {readme}")
    return ok


def hf_token_secret(token_file: str | None, namespace: str) -> str:
    """The token from a file, HF_TOKEN or a hidden prompt (never from the command line) into the cluster."""
    import getpass
    import sys

    from .backends import eks
    from .secrets import resolve_hf_token

    token = resolve_hf_token(token_file)
    if token is None:
        if not sys.stdin.isatty():
            raise SpecError("no Hugging Face token found: pass --file with a file holding it, or set HF_TOKEN")
        token = getpass.getpass("Hugging Face token (input hidden): ").strip()
    if not token:
        raise SpecError("the Hugging Face token is empty; nothing was created")
    return eks.put_hf_token(token, namespace)


def obs_report(run_id: str, runs_dir: str, output: str | None) -> str:
    from .report import write_report

    run_dir = Path(runs_dir) / run_id
    if not run_dir.is_dir():
        known = sorted(p.parent.name for p in Path(runs_dir).glob("*/metrics.jsonl"))
        hint = f"runs there: {', '.join(known)}" if known else "no runs there"
        raise SpecError(f"--run {run_id!r}: no folder {run_dir} ({hint}); check --run and --runs-dir")
    written = write_report(run_dir, Path(output) if output else None)
    return f"report written: {written.resolve()}"


def obs_grafana(port: int, kubeconfig: str | None) -> int:
    """`kubectl port-forward` to the platform's Grafana until interrupted; the login is never printed,
    only the Secret it lives in and the command that reads it."""
    import shutil
    import subprocess

    from .cluster import MONITORING_NAMESPACE, MONITORING_RELEASE

    config = Path(kubeconfig) if kubeconfig else kubeconfig_path()
    if not config.exists():
        raise SpecError(f"no kubeconfig at {config}: run `make up PROFILE=aws` first, or pass --kubeconfig")
    if shutil.which("kubectl") is None:
        raise SpecError("kubectl is not installed; install it (https://kubernetes.io/docs/tasks/tools/) and retry")
    service, secret = f"svc/{MONITORING_RELEASE}-grafana", f"{MONITORING_RELEASE}-grafana"
    print(
        "\n".join(
            [
                f"Grafana: http://localhost:{port}  (dashboards: GPU fleet, Training run; folder trainkit)",
                f"login:   user admin; the password is in Secret {MONITORING_NAMESPACE}/{secret}, key admin-password:",
                f"         kubectl --kubeconfig {config} -n {MONITORING_NAMESPACE} get secret {secret} "
                "-o jsonpath='{.data.admin-password}' | base64 -d",
                "Ctrl-C stops the port-forward.",
            ]
        ),
        flush=True,
    )
    command = [
        "kubectl",
        "--kubeconfig",
        str(config),
        "-n",
        MONITORING_NAMESPACE,
        "port-forward",
        service,
        f"{port}:80",
    ]
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0
