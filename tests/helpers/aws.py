"""An AWS emulator for the tests: moto's server on 127.0.0.1, and the fake credentials that go with it. Also what
the emulated accounts share (tests/helpers/batch_moto.py, tests/helpers/sagemaker_moto.py): moto's server run in
this process (`ThreadedMoto`), Service Quotas added to it (`patched_quotas`), and the account's common parts
(`MotoAccount`, `push_image_and_save`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.containers import free_port
from tests.helpers.waiting import wait_until_serving

ACCOUNT, REGION = "123456789012", "us-east-1"  # moto's default account

FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@contextlib.contextmanager
def in_process_bucket(name: str) -> Iterator:
    """An S3 client on moto in this process (mock_aws), with bucket `name` made."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=name)
        yield client


@contextlib.contextmanager
def moto_server(log_path: Path, env: dict | None = None) -> Iterator[str]:
    """An AWS emulator (moto server) on 127.0.0.1; yields its endpoint URL. Real HTTP, real boto3 calls."""
    port = free_port()
    log = log_path.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{endpoint}/moto-api/", server, "moto server did not start", timeout=60)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def moto_keys() -> dict:
    """The fake credentials as boto3.client's keywords."""
    return {
        "aws_access_key_id": FAKE_AWS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": FAKE_AWS["AWS_SECRET_ACCESS_KEY"],
    }


CLIENT_LOCK = threading.Lock()
"""boto3's default session makes clients one thread at a time (boto3 User Guide, "Multithreading or
multiprocessing with clients": a client is thread-safe, its creation from the shared default session is not). The
stand-ins make them from several threads at once: a Batch node's container reading its secrets, the scheduler."""


def moto_client(service: str, endpoint: str):
    import boto3

    with CLIENT_LOCK:
        return boto3.client(service, region_name=REGION, endpoint_url=endpoint, **moto_keys())


class ThreadedMoto:
    """moto's server run in this process (moto.server.ThreadedMotoServer) on a free port of 127.0.0.1, so the parts
    moto leaves out can be patched into it. Its endpoint, clients and the environment of trainkit's commands
    (AWS_ENDPOINT_URL, which boto3 honours for every service) are known before it starts; as a context
    manager it starts from an empty account and leaves one (moto's backends live in this process), then stops."""

    def __init__(self):
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer

        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.endpoint = f"http://127.0.0.1:{port}"
        self.session = {"region_name": REGION, "endpoint_url": self.endpoint, **moto_keys()}
        self.env = {**FAKE_AWS, "AWS_ENDPOINT_URL": self.endpoint}  # trainkit's commands reach it with these

    def client(self, service: str):
        return moto_client(service, self.endpoint)

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=30).read()

    def __enter__(self) -> ThreadedMoto:
        self.server.start()
        try:
            self.reset()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_) -> None:
        self.reset()
        self.server.stop()


def default_quota(service_code: str, service_name: str, code: str, name: str) -> dict:
    """A quota as ListAWSDefaultServiceQuotas lists it, at its default 0."""
    return {
        "ServiceCode": service_code,
        "ServiceName": service_name,
        "QuotaCode": code,
        "QuotaName": name,
        "Value": 0.0,
        "Unit": "None",
        "Adjustable": True,
        "GlobalQuota": False,
    }


@contextlib.contextmanager
def patched_quotas(service_code: str, defaults: list[dict], applied: dict, key: str) -> Iterator[None]:
    """Service Quotas for `service_code` in moto (moto 5.2 knows only VPC's): ListAWSDefaultServiceQuotas lists
    `defaults`; GetServiceQuota answers a listed quota's applied value, `applied[quota[key]]`, or
    NoSuchResourceException for a quota the account never had applied (Service Quotas API reference,
    GetServiceQuota: "If the applied quota value is not available for a quota, the quota is not retrieved").
    Other services' quotas stay moto's."""
    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.models import ServiceQuotasBackend

    list_defaults = ServiceQuotasBackend.list_aws_default_service_quotas
    get_quota = ServiceQuotasBackend.get_service_quota

    patched = service_code

    def list_aws_default_service_quotas(self, service_code):  # moto passes these by name
        return defaults if service_code == patched else list_defaults(self, service_code)

    def get_service_quota(self, service_code, quota_code):
        if service_code != patched:
            return get_quota(self, service_code, quota_code)
        quota = next((q for q in defaults if q["QuotaCode"] == quota_code), None)
        if quota is None or quota[key] not in applied:
            raise NoSuchResource()
        return {**quota, "Value": float(applied[quota[key]])}

    ServiceQuotasBackend.list_aws_default_service_quotas = list_aws_default_service_quotas
    ServiceQuotasBackend.get_service_quota = get_service_quota
    try:
        yield
    finally:
        ServiceQuotasBackend.list_aws_default_service_quotas = list_defaults
        ServiceQuotasBackend.get_service_quota = get_quota


def push_image_and_save(moto: ThreadedMoto, blobs, stack_id: str, outputs: dict) -> str:
    """The training image in ECR with trainkit's label (tests/helpers/ecr_blobs.py: `blobs` serves its blobs), and
    the stack's outputs recorded as `make up` records them, `outputs` beside the common ones; the image's
    reference."""
    from trainkit.backends.eks.image import POD_ENTRY_LABEL, POD_ENTRY_MODULE
    from trainkit.infra.outputs import save_outputs

    ecr = moto.client("ecr")
    url = ecr.create_repository(repositoryName="trainkit/train")["repository"]["repositoryUri"]
    blobs.push(ecr, "trainkit/train", "v1", {POD_ENTRY_LABEL: POD_ENTRY_MODULE})
    save_outputs({"gpu_instance_type": "p5.48xlarge", "region": REGION, "stack_id": stack_id, **outputs})
    return f"{url}:v1"


@dataclass
class MotoAccount:
    """An emulated account: its endpoint, the environment the commands reach it with, the stack's outputs, the
    training image."""

    endpoint: str
    env: dict
    stack: dict
    image: str

    def client(self, service: str):
        return moto_client(service, self.endpoint)

    def poll(self, describe: Callable[[], dict], key: str, ended: tuple, what: str, timeout: float) -> dict:
        """`describe()` once its `key` is one of `ended`, looking every half second."""
        deadline = time.monotonic() + timeout
        while True:
            described = describe()
            if described[key] in ended:
                return described
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} still {described[key]} after {timeout:.0f} s")
            time.sleep(0.5)
