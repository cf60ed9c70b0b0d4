"""`invoke obs.*`: generated dashboards and rules, a run's report PNG, the cluster's Grafana."""

from __future__ import annotations

from invoke import Collection, Exit

from trainkit.cli.options import required, task, user_errors


@task(name="generate", help={"check": "Change nothing; exit 1 and name the files that regenerating would change."})
def generate(c, check=False):
    """Regenerate observability/generated/ (dashboards JSON, alert rules) from observability/*.py."""
    from observability import generate as generator

    code = generator.main(["--check"] if check else [])
    if code:
        raise Exit(code=code)


@task(
    help={
        "run": "The run id (its folder under --runs-dir; a SageMaker run's files are copied there from S3).",
        "runs-dir": "Where runs live (default runs); other runs of the model there give the scaling panel.",
        "output": "PNG to write (default <runs-dir>/<run>/report.png).",
    }
)
@user_errors
def report(c, run=None, runs_dir="runs", output=None):
    """One PNG of a run: loss, throughput and MFU over steps; scaling against ideal across world sizes."""
    from trainkit.plan.report import report_run

    print(report_run(required(run, "--run", "the run id to report on"), runs_dir, output))


@task(
    help={
        "runs-dir": "The runs folder whose embedded MLflow store (<runs-dir>/mlflow.db) to show (default runs).",
        "port": "Port on 127.0.0.1 (default 5000; a free one when 5000 is taken).",
    }
)
@user_errors
def mlflow(c, runs_dir="runs", port=5000):
    """MLflow's UI over the runs folder's embedded store (runs tracked with --track mlflow), on 127.0.0.1 until
    Ctrl-C. Grafana is for operations (is the job alive, are the GPUs busy); MLflow compares runs."""
    from trainkit.services.mlflow import show_store

    show_store(runs_dir, int(port))


@task(
    help={
        "port": "Local port for Grafana (default 3000).",
        "kubeconfig": "kubeconfig of the cluster (default the one `make up PROFILE=aws` wrote).",
    }
)
@user_errors
def grafana(c, port=3000, kubeconfig=None):
    """EKS: port-forward the platform's Grafana, print its URL and where its login comes from. Ctrl-C ends it."""
    from trainkit.backends.eks.grafana import port_forward_grafana

    raise Exit(code=port_forward_grafana(int(port), kubeconfig))


collection = Collection("obs", generate, report, mlflow, grafana)
