"""Each EKS job reaches its own rendezvous keys in the platform's etcd and no other job's: the platform etcd as the
stack renders it, run with the real etcd 3.4 binary (TLS, client certificates, v2 auth), the issuer against the
stand-in's API, jobs rendered and created by the launcher (their command swapped for `sleep`: what is tested is
whom etcd lets in, not training), each pod in a network namespace of its own (tests/helpers/platform_etcd.py).

The rendezvous itself over TLS, with a job's identity, runs in tests/e2e/test_eks_backend_runs.py."""

from __future__ import annotations

import datetime
import shutil
import ssl
import time
import urllib.error
import urllib.request

import pytest

from tests.helpers.eks import IMAGE
from tests.helpers.platform_etcd import identity_of, platform_etcd
from trainkit.backends import job_from_flags
from trainkit.backends.eks import cluster, submission
from trainkit.backends.eks.etcd_issuer import STATUS_PASSED
from trainkit.backends.eks.etcd_tls import CertificateAuthority, client_context, job_identity
from trainkit.backends.eks.kube import GROUP, PLURAL, VERSION, Kube
from trainkit.run.torchrun import RENDEZVOUS_PREFIX, STORE_PREFIX
from trainkit.workloads.recipe import recipe


def create_sleeping_job(run_id: str, rdzv_id: str) -> dict:
    """A job as `invoke train --target eks` renders and creates it, its pods running `sleep`."""
    job = job_from_flags(
        {"target": "eks", "model": "llama2-tiny", "nodes": 1, "nproc": 1, "run_id": run_id, "image": IMAGE}
    )
    parts, manifest = submission.job_objects(job, recipe(job), rdzv_id, None, submission.token(), "0" * 64)
    container = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container.update(command=["sleep", "600"], args=[])
    submission.create_job(Kube.connect(), job, parts, manifest)
    return manifest


def call(url: str, context: ssl.SSLContext, method: str = "GET", value: str | None = None) -> int:
    data = None if value is None else f"value={value}".encode()
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_for(what: str, condition, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.1)


def test_a_job_reaches_only_its_own_keys_and_loses_them_when_it_ends(fake, tmp_path):
    with platform_etcd(fake, tmp_path / "etcd.log") as etcd:
        names = [
            create_sleeping_job(run, rdzv)["metadata"]["name"]
            for run, rdzv in (("first", "first-0a1b2c3d"), ("second", "second-4e5f6a7b"))
        ]
        # the kubelet starts a pod only once its Secret exists: the issuer wrote each job's, owned by the job
        for name in names:
            wait_for(
                f"{name}'s pod running",
                lambda n=name: fake.pods[(cluster.JOBS_NAMESPACE, f"{n}-worker-0")].phase == "Running",
            )
            owners = fake.secret_metadata[(cluster.JOBS_NAMESPACE, cluster.etcd_identity_secret(name))][
                "ownerReferences"
            ]
            assert [owner["uid"] for owner in owners] == [fake.jobs[(cluster.JOBS_NAMESPACE, name)]["metadata"]["uid"]]
        mine, theirs = identity_of(fake, names[0]), identity_of(fake, names[1])
        state = f"{etcd.url}/v2/keys{RENDEZVOUS_PREFIX}/first-0a1b2c3d"
        store = f"{etcd.url}/v2/keys{STORE_PREFIX}/first-0a1b2c3d"
        with client_context(etcd.ca_cert, mine) as context:
            assert call(state, context, "PUT", "round-1") == 201 and call(f"{store}/k", context, "PUT", "x") == 201
            assert call(state, context) == 200 and call(store, context) == 200
            # nothing beyond its own: another job's state, the store's folder, everything
            assert call(f"{etcd.url}/v2/keys{RENDEZVOUS_PREFIX}/second-4e5f6a7b", context) == 401
            assert call(f"{etcd.url}/v2/keys/?recursive=true", context) == 401
        with client_context(etcd.ca_cert, theirs) as context:  # another job's pod, with its own valid identity
            assert call(state, context) == 401 and call(state, context, "PUT", "evil") == 401
            assert call(store, context) == 401 and call(f"{store}/k", context, "PUT", "evil") == 401
            assert call(f"{etcd.url}/v2/keys{STORE_PREFIX}?recursive=true", context) == 401
            assert call(f"{etcd.url}/v2/auth/users", context) == 401  # nor etcd's users and roles
        # a process without a certificate, or with one from another CA, does not get past the handshake
        stranger = CertificateAuthority.create()
        for identity, authority in (
            (None, etcd.ca_cert),
            (stranger.issue(job_identity("x"), datetime.timedelta(hours=1)), etcd.ca_cert),
        ):
            # TLS 1.3: etcd's refusal of a missing or foreign certificate comes with the first read, as its alert or
            # as the connection closed; never the client doubting etcd's own certificate
            with client_context(authority, identity) as context, pytest.raises(OSError) as refused:
                call(state, context)
            error = refused.value.reason if isinstance(refused.value, urllib.error.URLError) else refused.value
            assert isinstance(error, ssl.SSLError) and not isinstance(error, ssl.SSLCertVerificationError), error

        # a job that names a live job's rendezvous id (a submitter writes the spec) gets no identity: its pod waits
        thief = create_sleeping_job("thief", "first-0a1b2c3d")["metadata"]["name"]
        wait_for("the issuer's refusal", lambda: any(f"job {thief} gets no etcd identity" in line for line in etcd.log))
        assert "belongs to job " + names[0] in "\n".join(etcd.log)
        assert (cluster.JOBS_NAMESPACE, cluster.etcd_identity_secret(thief)) not in fake.secrets
        assert fake.pods[(cluster.JOBS_NAMESPACE, f"{thief}-worker-0")].phase == "Pending"

        # the first job ends: its identity is revoked (its certificate now reaches nothing) and its keys go
        uid = fake.jobs[(cluster.JOBS_NAMESPACE, names[0])]["metadata"]["uid"]
        Kube.connect().custom.delete_namespaced_custom_object(GROUP, VERSION, cluster.JOBS_NAMESPACE, PLURAL, names[0])
        wait_for(
            "the revocation", lambda: f"etcd issuer: revoked {job_identity(uid)} (its job ended or is gone)" in etcd.log
        )
        with client_context(etcd.ca_cert, mine) as context:
            assert call(state, context) == 401
        assert etcd.issuer.auth.request("GET", f"/v2/keys{RENDEZVOUS_PREFIX}/first-0a1b2c3d")[0] == 404
        assert etcd.issuer.auth.request("GET", f"/v2/keys{STORE_PREFIX}/first-0a1b2c3d")[0] == 404
        # the thief's job now holds the id, as the only live job naming it
        wait_for(
            "the thief's identity",
            lambda: (cluster.JOBS_NAMESPACE, cluster.etcd_identity_secret(thief)) in fake.secrets,
        )
        status = fake.configmaps[(cluster.JOBS_NAMESPACE, cluster.ETCD_ISSUER)]["data"]
        # etcd comes back without its data (a new volume): auth is off and it knows no one, and the next pass sets
        # both up again: the live job's identity reaches its keys, another identity does not
        etcd.pod.stop()
        shutil.rmtree(etcd.pod.root / "data")
        etcd.pod.start_etcd()
        thief_uid = fake.jobs[(cluster.JOBS_NAMESPACE, thief)]["metadata"]["uid"]
        root = etcd.issuer.auth

        def set_up_again() -> bool:
            found = root.request("GET", "/v2/auth/users")[1].get("users") or []
            return root.request("GET", "/v2/auth/enable")[1].get("enabled") and any(
                user["user"] == job_identity(thief_uid) for user in found
            )

        wait_for("the issuer to set etcd up again", set_up_again)
        with client_context(etcd.ca_cert, identity_of(fake, thief)) as context:
            assert call(state, context, "PUT", "round-2") == 201
        with client_context(etcd.ca_cert, theirs) as context:
            assert call(state, context) == 401
        # what the launcher reads before it submits an etcd job (preflight.check_etcd_issuer): the issuer runs
        assert status["ca.crt"] == etcd.ca_cert.decode()
        passed = datetime.datetime.fromisoformat(status[STATUS_PASSED])
        assert abs((datetime.datetime.now(datetime.UTC) - passed).total_seconds()) < 60
