"""Experiment tracking's pure parts (issue 54): what the tracking options may say (trainkit/job/tracking.py), the
spec as MLflow parameters and a metrics record as MLflow metrics (training/common/tracking.py)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from training.common.tracking import MAX_PARAM_LENGTH, record_metrics, shown_uri, spec_params, store_uri
from trainkit.errors import SpecError
from trainkit.job import build
from trainkit.job.tracking import (
    PLACEHOLDER_SERVER,
    TRACKING_SERVER_ARN,
    egress_note,
    redacted,
    stack_tracking,
    validate_tracking,
)
from trainkit.run.secrets import HF_TOKEN, MLFLOW_TOKEN, job_credentials, token_to_store

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:5000",
        "https://mlflow.example.com/prefix",
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team-server-1",
        "arn:aws-us-gov:sagemaker:us-gov-west-1:123456789012:mlflow-tracking-server/a",
        "arn:aws:sagemaker:eu-west-1:123456789012:mlflow-app/app-0123abcd",
        "sqlite:////tmp/mlflow.db",
    ],
)
def test_the_uris_trainkit_sends_to_are_accepted(uri):
    validate_tracking(build({"track": "mlflow", "tracking_uri": uri}))


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ({"tracking_uri": "http://h:1"}, "add --track mlflow"),
        ({"experiment": "x"}, "add --track mlflow"),
        ({"track": "mlflow", "tracking_uri": "ftp://h"}, "ftp scheme is not one trainkit sends to"),
        ({"track": "mlflow", "tracking_uri": "databricks"}, "databricks scheme is not one"),
        ({"track": "mlflow", "tracking_uri": "file:///tmp/mlruns"}, "file scheme is not one"),
        ({"track": "mlflow", "tracking_uri": "http://"}, "names no host"),
        ({"track": "mlflow", "tracking_uri": "sqlite://relative.db"}, "sqlite:///FILE"),
        ({"track": "mlflow", "tracking_uri": "arn:aws:sagemaker:us-east-1:123456789012:model/x"}, "ARN"),
        ({"track": "mlflow", "tracking_uri": "arn:aws:s3:::bucket"}, "ARN"),
        ({"track": "mlflow", "tracking_uri": "arn:aws:sagemaker:us-east-1:1234:mlflow-tracking-server/x"}, "ARN"),
        ({"track": "mlflow", "experiment": "  "}, "--experiment is empty"),
    ],
)
def test_what_the_tracking_options_may_not_say_is_refused_naming_the_flag(flags, said):
    with pytest.raises(SpecError, match=said.replace("(", r"\(")):
        validate_tracking(build(flags))


def test_a_server_name_follows_the_service_model():
    """TrackingServerName: `[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}` (botocore's SageMaker model)."""
    stem = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/"
    assert TRACKING_SERVER_ARN.fullmatch(stem + "a--b")
    assert not TRACKING_SERVER_ARN.fullmatch(stem + "-a") and not TRACKING_SERVER_ARN.fullmatch(stem + "a_b")


def test_credentials_never_reach_a_message_or_a_console_line():
    uri = "https://alice:s3cret@mlflow.example:8443/x"
    assert "s3cret" not in redacted(uri) and "s3cret" not in shown_uri(uri)
    with pytest.raises(SpecError) as refused:
        validate_tracking(build({"track": "mlflow", "tracking_uri": uri}))
    assert "s3cret" not in str(refused.value) and "alice" not in str(refused.value)


def test_the_spec_becomes_flat_text_parameters():
    job = build({"model": "llama2-tiny", "track": "mlflow", "lr": 0.002})
    params = spec_params(job.to_dict())
    assert params["optimisation.lr"] == "0.002" and params["model.name"] == "llama2-tiny"
    assert params["tracking.track"] == "mlflow" and params["tracking.uri"] == "null"
    assert all(isinstance(v, str) for v in params.values())
    long = spec_params({"run": {"notes": ["x" * (2 * MAX_PARAM_LENGTH)]}})["run.notes"]
    assert len(long) == MAX_PARAM_LENGTH and long.endswith("...")


def test_a_records_numbers_are_its_metrics():
    record = {"step": 3, "time": 1.5, "loss": 2.5, "lr": 1e-4, "warmup": True, "mfu": None, "epoch": 0}
    record |= {"note": "x", "grad_norm": math.inf, "tokens_seen": 4096}
    assert record_metrics(record) == {"loss": 2.5, "lr": 1e-4, "epoch": 0.0, "tokens_seen": 4096.0}
    json.dumps(record_metrics(record))


def test_the_embedded_store_lies_beside_the_run_folders(tmp_path):
    job = build({"track": "mlflow"})
    assert store_uri(job, tmp_path / "runs" / "r1") == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    given = build({"track": "mlflow", "tracking_uri": "http://h:5000"})
    assert store_uri(given, tmp_path / "runs" / "r1") == "http://h:5000"


def test_an_aws_job_without_a_uri_logs_to_the_stacks_tracking_server_or_is_refused():
    server = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/trainkit-mlflow"
    recorded = SimpleNamespace(recorded=True, mlflow={"tracking_server_arn": server})
    job = build({"track": "mlflow", "target": "batch"})
    stack_tracking(job, recorded)
    assert job.tracking.uri == server and any(server in note for note in job.run.notes)
    given = build({"track": "mlflow", "target": "batch", "tracking_uri": "https://mlflow.example"})
    stack_tracking(given, recorded)
    assert given.tracking.uri == "https://mlflow.example"  # a given URI stays
    unrecorded = build({"track": "mlflow", "target": "sagemaker"})
    stack_tracking(unrecorded, SimpleNamespace(recorded=False, mlflow=None))
    assert unrecorded.tracking.uri == PLACEHOLDER_SERVER and "placeholder" in unrecorded.run.notes[-1]
    with pytest.raises(SpecError, match="mlflow_enabled = true"):
        stack_tracking(build({"track": "mlflow", "target": "eks"}), SimpleNamespace(recorded=True, mlflow=None))


@pytest.mark.parametrize(
    ("uri", "target", "said"),
    [
        ("http://mlflow.internal:5000", "batch", "port 5000"),
        ("http://mlflow.internal", "sagemaker", "port 80"),
        ("https://mlflow.internal", "batch", None),
        ("https://mlflow.internal:443/x", "sagemaker", None),
        ("http://mlflow.internal:5000", "eks", None),  # EKS's nodes may go out anywhere
    ],
)
def test_a_port_the_jobs_security_group_does_not_let_out_is_said(uri, target, said):
    note = egress_note(build({"track": "mlflow", "tracking_uri": uri, "target": target}))
    assert (note is None) if said is None else (said in note and "TCP 443 only" in note), note


def test_a_job_gets_the_mlflow_token_only_for_an_http_server_and_the_hf_token_only_where_its_workload_may_read_it():
    workload = SimpleNamespace(token=False)
    for uri, gets in (
        ("https://mlflow.internal", (MLFLOW_TOKEN,)),
        ("HTTP://mlflow.internal:5000", (MLFLOW_TOKEN,)),
        ("arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/t", ()),  # signed with the job's role
    ):
        assert job_credentials(build({"track": "mlflow", "tracking_uri": uri, "target": "batch"}), workload) == gets
    untracked = build({"tracking_uri": None, "target": "batch"})
    assert job_credentials(untracked, SimpleNamespace(token=True)) == (HF_TOKEN,)


def test_a_token_to_store_comes_from_a_file_or_the_environment_never_a_flag(tmp_path, monkeypatch):
    (tmp_path / "t").write_text("  tok-file\n")
    assert token_to_store(MLFLOW_TOKEN, str(tmp_path / "t")) == "tok-file"
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-env")
    assert token_to_store(MLFLOW_TOKEN, None) == "tok-env"
    with pytest.raises(SpecError, match="--file .*missing does not exist"):
        token_to_store(MLFLOW_TOKEN, str(tmp_path / "missing"))
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN")
    monkeypatch.setattr("sys.stdin", SimpleNamespace(isatty=lambda: False))
    with pytest.raises(SpecError, match="no MLflow tracking server's token found: .* or set MLFLOW_TRACKING_TOKEN"):
        token_to_store(MLFLOW_TOKEN, None)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SpecError, match="is empty; nothing was stored"):
        token_to_store(MLFLOW_TOKEN, str(tmp_path / "empty"))
