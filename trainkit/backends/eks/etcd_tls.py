"""The platform etcd's identities: a certificate authority, certificates, and etcd's v2 users and roles.

The platform's etcd (terraform/stacks/platform) serves HTTPS only and asks every client for a certificate signed by
the platform's CA (`--client-cert-auth`, `--trusted-client-ca-file`): a process without one is refused at the
handshake. With v2 authentication on, etcd then takes the certificate's common name as the v2 user
(userFromClientCertificate, used by hasKeyPrefixAccess when a request has no Authorization header: etcd 3.5's
server/etcdserver/api/v2http/client_auth.go, the platform's image; 3.4's etcdserver/api/v2http/client_auth.go, the
binary the tests run, is the same) and checks the key against that user's roles: a pattern ending in `*` is a
prefix, any other is the exact key (v2auth/auth.go, simpleMatch; a recursive read needs a `*` pattern,
prefixMatch). A certificate whose common name is no user falls to the guest role, which `enable_auth`
empties (etcd creates it with read and write on `/*` when auth is first enabled: v2auth EnableAuth).

Each job gets a user and a role of its own (`job_identity`), with read and write on its own keys only
(`job_keys`): torch's rendezvous state `/torch/elastic/rendezvous/<rdzv id>` (etcd_rendezvous_backend.py,
EtcdRendezvousBackend) and the store under `/torch/elastic/store/<rdzv id>/`, where trainkit's `trainkit-etcd`
backend keeps each job's EtcdStore (trainkit/run/rendezvous.py; torch's own puts every job's store in one folder
and lists the whole folder on every wait, which no per-job role could allow). The issuer
(trainkit/backends/eks/etcd_issuer.py) creates them when a job is created and removes them when it ends.

Keys are ECDSA P-256, which Go's crypto/tls (etcd) and OpenSSL (the pods' urllib3) both take.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import secrets
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from trainkit.run.torchrun import RENDEZVOUS_PREFIX, STORE_PREFIX, TLS_CERT, TLS_KEY

ROOT_USER = "root"  # v2auth.RootUserName: the one user that may change users, roles and auth itself
GUEST_ROLE = "guest"  # v2auth.GuestRoleName: what a request without a known user gets
SKEW = datetime.timedelta(minutes=5)  # valid from a little before now: nodes' clocks differ by seconds


def job_keys(rdzv_id: str) -> list[str]:
    """The etcd key patterns a job with this rendezvous id reads and writes: its state key exactly, its store's
    folder (a non-recursive GET of it lists it) and everything in it."""
    store = f"{STORE_PREFIX}/{rdzv_id}"
    return [f"{RENDEZVOUS_PREFIX}/{rdzv_id}", store, f"{store}/*"]


def job_identity(job_uid: str) -> str:
    """The common name, v2 user and v2 role of one PyTorchJob (its uid: never reused, unlike its name)."""
    return f"trainkit-job-{job_uid}"


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM."""

    cert: bytes
    key: bytes

    @property
    def not_after(self) -> datetime.datetime:
        return x509.load_pem_x509_certificate(self.cert).not_valid_after_utc


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    pkcs8, plain = serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, pkcs8, plain)


class CertificateAuthority:
    """The platform's CA: it signs etcd's server certificate and every client's."""

    def __init__(self, issued: Issued):
        self.issued = issued
        self._cert = x509.load_pem_x509_certificate(issued.cert)
        self._key = serialization.load_pem_private_key(issued.key, password=None)

    @classmethod
    def create(cls, name: str = "trainkit-etcd-ca", valid_for: datetime.timedelta = datetime.timedelta(days=3650)):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = utc_now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(now + valid_for)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)))

    @property
    def cert(self) -> bytes:
        return self.issued.cert

    def issue(self, common_name: str, valid_for: datetime.timedelta, server_names: list[str] | None = None) -> Issued:
        """A client certificate for `common_name`; with `server_names` (DNS names or IP addresses), a server's."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = utc_now()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(min(now + valid_for, self._cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._cert.public_key()), critical=False)
        )
        if server_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(_names(server_names)), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _usage(cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _names(names: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


@contextlib.contextmanager
def client_context(ca_cert: bytes, issued: Issued | None) -> Iterator[ssl.SSLContext]:
    """A TLS context that trusts only `ca_cert` and presents `issued` (None: no certificate). ssl loads a
    certificate from files only: they live in a private folder for the moment it takes."""
    context = ssl.create_default_context(cadata=ca_cert.decode())
    if issued is not None:
        with tempfile.TemporaryDirectory(prefix="trainkit-etcd-") as folder:  # mode 0700
            cert, key = Path(folder) / TLS_CERT, Path(folder) / TLS_KEY
            cert.write_bytes(issued.cert)
            key.touch(mode=0o600)
            key.write_bytes(issued.key)
            context.load_cert_chain(cert, key)
    yield context


class EtcdError(RuntimeError):
    """etcd answered with an error status; `status` is the HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class EtcdAuth:
    """etcd's v2 auth API at `url` (https://host:port), as the root user (`root`: a certificate for ROOT_USER)."""

    def __init__(self, url: str, ca_cert: bytes, root: Issued, timeout_s: float = 10):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        with client_context(ca_cert, root) as context:
            self._context = context

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, context=self._context, timeout=self.timeout_s) as answer:
                text = answer.read()
                return answer.status, json.loads(text) if text.strip() else {}
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            return error.code, {"message": text.strip()}

    def _ok(self, method: str, path: str, body: dict | None = None, also: tuple[int, ...] = ()) -> dict:
        status, answer = self.request(method, path, body)
        if status >= 300 and status not in also:
            raise EtcdError(status, f"etcd {method} {path}: {status} {answer.get('message', answer)}")
        return answer

    def enable_auth(self) -> None:
        """Once per etcd: a root user (its password random and dropped: root signs in by certificate), auth on,
        and the guest role emptied. Each step is skipped when already done, so a restarted issuer repeats it."""
        if not self._ok("GET", "/v2/auth/enable").get("enabled"):
            user = {"user": ROOT_USER, "password": secrets.token_urlsafe(32)}
            self._ok("PUT", f"/v2/auth/users/{ROOT_USER}", user, also=(409,))
            self._ok("PUT", "/v2/auth/enable")
        guest = self._ok("GET", f"/v2/auth/roles/{GUEST_ROLE}", also=(404,))
        granted = guest.get("permissions", {}).get("kv", {})
        read, write = granted.get("read") or [], granted.get("write") or []
        if read or write:
            revoke = {"role": GUEST_ROLE, "revoke": {"kv": {"read": read, "write": write}}}
            self._ok("PUT", f"/v2/auth/roles/{GUEST_ROLE}", revoke)

    def users(self) -> set[str]:
        return {user["user"] for user in self._ok("GET", "/v2/auth/users").get("users") or []}

    def grant(self, identity: str, rdzv_id: str) -> None:
        """A role `identity` with read and write on the job's keys, and a user `identity` holding it."""
        keys = job_keys(rdzv_id)
        role = {"role": identity, "permissions": {"kv": {"read": keys, "write": keys}}}
        self._ok("PUT", f"/v2/auth/roles/{identity}", role, also=(409,))
        user = {"user": identity, "password": secrets.token_urlsafe(32), "roles": [identity]}
        self._ok("PUT", f"/v2/auth/users/{identity}", user, also=(409,))

    def revoke(self, identity: str) -> None:
        """The user and role go (its certificate now maps to the empty guest role), then the keys the role held."""
        role = self._ok("GET", f"/v2/auth/roles/{identity}", also=(404,))
        self._ok("DELETE", f"/v2/auth/users/{identity}", also=(404,))
        self._ok("DELETE", f"/v2/auth/roles/{identity}", also=(404,))
        for key in role.get("permissions", {}).get("kv", {}).get("write") or []:
            if not key.endswith("*"):  # a folder's contents go with the folder
                self._ok("DELETE", f"/v2/keys{key}?recursive=true", also=(404,))
