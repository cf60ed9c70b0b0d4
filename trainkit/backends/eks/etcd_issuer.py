"""The platform etcd's issuer: its CA, etcd's own certificate, and one etcd identity per training job.

    python -m trainkit.backends.eks.etcd_issuer --etcd https://trainkit-etcd.trainkit-system.svc:2379

The platform stack runs it as a one-replica Deployment in trainkit-system, in the idle guard's image
(terraform/stacks/platform). Each pass, every --interval seconds:
- The CA, from the Secret trainkit-etcd-ca, which the first pass ever creates: its key is made in the cluster and
  stays there (never in Terraform's state or on a laptop). etcd's serving certificate, in trainkit-etcd-server,
  made or renewed when it has less than SERVER_RENEW_BEFORE left (etcd reads its certificate files at each
  handshake, and the kubelet refreshes a mounted Secret's files). root's certificate lives in memory only; with it
  the pass turns etcd's v2 auth on and empties the guest role (etcd_tls.EtcdAuth.enable_auth), which it checks on
  every pass: an etcd that lost its data comes back with auth off, open to any certificate of the CA until then.
- Every PyTorchJob trainkit made in the jobs' namespace with an etcd rendezvous that has not ended gets an etcd
  user and role of its own (read and write on its rendezvous id's keys only: etcd_tls.job_keys) and its client
  certificate in the Secret `<job>-etcd`, owned by the job, so Kubernetes deletes it with the job. The certificate
  is valid for the job's activeDeadlineSeconds plus an hour, or DEFAULT_VALIDITY for a job without a deadline,
  and renewed in its last JOB_RENEW_BEFORE. The pods mount it; until it exists the kubelet keeps them waiting.
- A rendezvous id belongs to one job: a submitter writes the spec, so a second job naming a live job's id gets no
  identity (the log says so once), and its pods wait. The earliest created keeps it.
- Every job identity etcd holds whose job has ended or is gone is revoked: its user and role go (its certificate
  now maps to the empty guest role), then its keys, and its Secret.
A pass that fails (the API or etcd unreachable) logs one line; the next pass tries again.

Each minute it also writes the ConfigMap trainkit-etcd-issuer in the jobs' namespace (the CA's certificate and the
time of its last pass): the launcher refuses an etcd job while it is missing (trainkit/backends/eks/preflight.py).

Kubernetes access (terraform/stacks/platform): PyTorchJobs listed, Secrets read, created and deleted, and its
ConfigMap, in the jobs' namespace; its own two Secrets in trainkit-system.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import re
import sys
import time
from dataclasses import dataclass, field

from trainkit.backends.eks import cluster
from trainkit.backends.eks.etcd_tls import ROOT_USER, CertificateAuthority, EtcdAuth, Issued, job_identity, utc_now
from trainkit.backends.eks.kube import GROUP, PLURAL, VERSION, Kube, api_errors, unless_missing
from trainkit.backends.eks.render import MANAGED_BY
from trainkit.run.torchrun import TLS_CA, TLS_CERT, TLS_KEY

DEFAULT_VALIDITY = datetime.timedelta(days=30)
JOB_RENEW_BEFORE = datetime.timedelta(days=1)
SERVER_VALIDITY = datetime.timedelta(days=365)
SERVER_RENEW_BEFORE = datetime.timedelta(days=30)
ROOT_VALIDITY = datetime.timedelta(days=1)
RDZV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # no '/' or '*': an id is never another's key prefix
ENDED = ("Succeeded", "Failed")
STATUS_EVERY = datetime.timedelta(minutes=1)
STATUS_PASSED = "last-pass"  # the status ConfigMap's key: when the issuer's last pass ran (ISO 8601, UTC)
JOB_IDENTITY_PREFIX = job_identity("")


@dataclass(frozen=True)
class JobView:
    """What the issuer reads of a PyTorchJob."""

    name: str
    uid: str
    rdzv_id: str
    created: str
    valid_for: datetime.timedelta


def live_jobs(items: list[dict]) -> list[JobView]:
    """trainkit's etcd-rendezvous jobs that have not ended and are not being deleted."""
    live = []
    for item in items:
        meta, spec = item.get("metadata", {}), item.get("spec", {})
        policy = spec.get("elasticPolicy") or {}
        if (
            any(meta.get("labels", {}).get(k) != v for k, v in MANAGED_BY.items())
            or policy.get("rdzvBackend") != "etcd"
        ):
            continue
        conditions = (item.get("status") or {}).get("conditions") or []
        if meta.get("deletionTimestamp") or any(c["type"] in ENDED and c.get("status") == "True" for c in conditions):
            continue
        deadline = (spec.get("runPolicy") or {}).get("activeDeadlineSeconds")
        valid_for = datetime.timedelta(seconds=deadline) + datetime.timedelta(hours=1) if deadline else DEFAULT_VALIDITY
        view = JobView(
            meta["name"], meta["uid"], str(policy.get("rdzvId", "")), meta.get("creationTimestamp", ""), valid_for
        )
        live.append(view)
    return live


@dataclass
class IdentityPlan:
    holders: list[JobView] = field(default_factory=list)
    refused: list[tuple[JobView, str]] = field(default_factory=list)
    revoke: list[str] = field(default_factory=list)


def plan(jobs: list[JobView], identities: set[str]) -> IdentityPlan:
    """Who gets an identity (the earliest created job of each valid rendezvous id), who is refused and why, and
    which of etcd's job identities go (their job ended, went, or never held its id)."""
    out, held = IdentityPlan(), {}
    for job in sorted(jobs, key=lambda j: (j.created, j.name)):
        if not RDZV_ID.match(job.rdzv_id):
            out.refused.append((job, f"its rendezvous id {job.rdzv_id!r} is not 1-128 of [A-Za-z0-9._-]"))
        elif job.rdzv_id in held:
            out.refused.append((job, f"its rendezvous id {job.rdzv_id} belongs to job {held[job.rdzv_id]}"))
        else:
            held[job.rdzv_id] = job.name
            out.holders.append(job)
    wanted = {job_identity(job.uid) for job in out.holders}
    out.revoke = sorted(i for i in identities if i.startswith(JOB_IDENTITY_PREFIX) and i not in wanted)
    return out


def _files(secret) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}


def _tls_secret(name: str, namespace: str, issued: Issued, ca_cert: bytes, owner: dict | None = None) -> dict:
    files = {TLS_CERT: issued.cert, TLS_KEY: issued.key, TLS_CA: ca_cert}
    metadata = {"name": name, "namespace": namespace, "labels": {**MANAGED_BY, "app.kubernetes.io/name": name}}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": metadata,
        "data": {key: base64.b64encode(value).decode() for key, value in files.items()},
    }


@dataclass
class IssuerSettings:
    etcd_url: str
    system_namespace: str = cluster.PLATFORM_NAMESPACE
    jobs_namespace: str = cluster.JOBS_NAMESPACE
    server_names: list[str] = field(default_factory=cluster.etcd_server_names)


class Issuer:
    """One issuer's state across passes: the CA (loaded once), root's identity and whether auth is on."""

    def __init__(self, kube: Kube, settings: IssuerSettings, log=print):
        self.kube, self.settings, self.log = kube, settings, log
        self.ca: CertificateAuthority | None = None
        self.auth: EtcdAuth | None = None
        self.root_until = utc_now()
        self.refusals: set[tuple[str, str]] = set()  # said once each
        self.published: datetime.datetime | None = None

    # ------------------------------------------------------------ the platform's own certificates

    def _ca(self) -> CertificateAuthority:
        namespace, name = self.settings.system_namespace, cluster.ETCD_CA_SECRET
        found = unless_missing(self.kube.core.read_namespaced_secret, name, namespace)
        if found is None:
            created = CertificateAuthority.create()
            body = _tls_secret(name, namespace, created.issued, created.cert)
            api_error, _ = api_errors()
            try:
                self.kube.core.create_namespaced_secret(namespace, body)
                self.log(f"etcd issuer: created the CA in {namespace}/{name}")
                return created
            except api_error as error:  # another issuer made it first: use that one
                if error.status != 409:
                    raise
            found = self.kube.core.read_namespaced_secret(name, namespace)
        files = _files(found)
        return CertificateAuthority(Issued(files[TLS_CERT], files[TLS_KEY]))

    def _server_certificate(self, ca: CertificateAuthority, now: datetime.datetime) -> None:
        namespace, name = self.settings.system_namespace, cluster.ETCD_SERVER_SECRET
        found = unless_missing(self.kube.core.read_namespaced_secret, name, namespace)
        if found is not None:
            files = _files(found)
            current = Issued(files.get(TLS_CERT, b""), files.get(TLS_KEY, b""))
            if files.get(TLS_CA) == ca.cert and current.cert and current.not_after - now > SERVER_RENEW_BEFORE:
                return
        issued = ca.issue(cluster.ETCD_SERVICE, SERVER_VALIDITY, self.settings.server_names)
        body = _tls_secret(name, namespace, issued, ca.cert)
        if found is None:
            self.kube.core.create_namespaced_secret(namespace, body)
        else:
            self.kube.core.replace_namespaced_secret(name, namespace, body)
        self.log(f"etcd issuer: etcd's certificate in {namespace}/{name}, valid until {issued.not_after:%Y-%m-%d}")

    def _root(self, now: datetime.datetime) -> EtcdAuth:
        """root's client, its certificate renewed in its last hour; auth checked on every pass (two reads when it is
        on), since an etcd that lost its data starts with auth off and no users, and the pass then sets both up
        again before any job's request finds it open."""
        if self.auth is None or self.root_until - now < datetime.timedelta(hours=1):
            root = self.ca.issue(ROOT_USER, ROOT_VALIDITY)
            self.auth, self.root_until = EtcdAuth(self.settings.etcd_url, self.ca.cert, root), root.not_after
        self.auth.enable_auth()
        return self.auth

    # ------------------------------------------------------------ jobs

    def _job_secret(self, job: JobView, now: datetime.datetime) -> bool:
        """The job's identity Secret, owned by it and not near its end; True when it was (re)written."""
        namespace, name = self.settings.jobs_namespace, cluster.etcd_identity_secret(job.name)
        found = unless_missing(self.kube.core.read_namespaced_secret, name, namespace)
        if found is not None:
            owners = [owner.uid for owner in found.metadata.owner_references or []]
            cert = _files(found).get(TLS_CERT)
            if job.uid in owners and cert and Issued(cert, b"").not_after - now > JOB_RENEW_BEFORE:
                return False
            # an earlier job's of the same name, one near its end, or one the issuer did not write: replaced
            self.kube.core.delete_namespaced_secret(name, namespace)
        issued = self.ca.issue(job_identity(job.uid), job.valid_for)
        owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PyTorchJob", "name": job.name, "uid": job.uid}
        self.kube.core.create_namespaced_secret(namespace, _tls_secret(name, namespace, issued, self.ca.cert, owner))
        self.log(f"etcd issuer: job {job.name}: identity for rendezvous {job.rdzv_id}, until {issued.not_after:%c}")
        return True

    def prepare(self, now: datetime.datetime) -> CertificateAuthority:
        """The CA and etcd's certificate, which etcd needs before it starts (it mounts their Secret)."""
        if self.ca is None:
            self.ca = self._ca()
        self._server_certificate(self.ca, now)
        return self.ca

    def _publish(self, now: datetime.datetime) -> None:
        """The ConfigMap in the jobs' namespace that says the issuer runs (the launcher reads it before it submits
        an etcd job) and holds the CA's certificate, as kube-root-ca.crt does the cluster's; rewritten each minute."""
        if self.published is not None and now - self.published < STATUS_EVERY:
            return
        namespace, name = self.settings.jobs_namespace, cluster.ETCD_ISSUER
        data = {TLS_CA: self.ca.cert.decode(), STATUS_PASSED: now.isoformat(timespec="seconds")}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": MANAGED_BY}, "data": data}
        if unless_missing(self.kube.core.read_namespaced_config_map, name, namespace) is None:
            self.kube.core.create_namespaced_config_map(namespace, body)
        else:
            self.kube.core.replace_namespaced_config_map(name, namespace, body)
        self.published = now

    def pass_once(self) -> IdentityPlan:
        now = utc_now()
        self.prepare(now)
        auth = self._root(now)
        self._publish(now)
        namespace = self.settings.jobs_namespace
        listed = self.kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        known = auth.users()
        decided = plan(live_jobs(listed.get("items", [])), known)
        for job in decided.holders:
            if job_identity(job.uid) not in known:  # a pass costs etcd one listing, not two writes a job
                auth.grant(job_identity(job.uid), job.rdzv_id)
            self._job_secret(job, now)
        for job, why in decided.refused:
            if (job.uid, why) not in self.refusals:
                self.refusals.add((job.uid, why))
                self.log(f"etcd issuer: job {job.name} gets no etcd identity: {why}")
        for identity in decided.revoke:
            auth.revoke(identity)
            self.log(f"etcd issuer: revoked {identity} (its job ended or is gone)")
        return decided


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.backends.eks.etcd_issuer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--etcd", default=f"https://{cluster.etcd_endpoint()}", help="etcd's client URL")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    parser.add_argument("--once", action="store_true", help="one pass, then exit (0 when it succeeded)")
    args = parser.parse_args(argv)
    from trainkit.backends.eks.kube import connect_here

    issuer = Issuer(connect_here(), IssuerSettings(args.etcd))
    while True:
        try:
            issuer.pass_once()
            if args.once:
                return 0
        except Exception as error:  # the next pass tries again; the Deployment's log says why
            print(f"etcd issuer: pass failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            if args.once:
                return 1
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
