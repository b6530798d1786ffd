"""A real Kubernetes API server on this machine, for the `kube_real` tests and
`tpu-autoscaler local --kubernetes real`: etcd and kube-apiserver 1.20.2 (built by
`make kube-binaries`) started on free loopback ports in a temporary directory, RBAC on,
an admin token, KubeRay v1.7.0's CRDs installed; stopped by pid.

There is no scheduler, kubelet or controller-manager: pods stay Pending unless
something binds them (the simulated control plane, `controlplane/real_store.py`),
nothing garbage-collects, and a deleted namespace stays Terminating. Tests therefore
each work in a namespace of their own and never delete one.

Certificates (a CA, the serving certificate for 127.0.0.1, the service-account key
pair) are made with the `cryptography` package."""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from kubernetes import client

from tpu_autoscaler.controlplane import kube120
from tpu_autoscaler.controlplane.ports import free_ports

KUBE_VERSION = "1.20.2"
CACHE_ENV = "TPU_AUTOSCALER_KUBE_DIR"
HOW_TO_GET = (
    "no kube-apiserver/etcd binaries: run 'make kube-binaries' (root, apt; 5-20 min, once per "
    "machine)"
)
READY_TIMEOUT_S = 90.0
"""etcd and kube-apiserver each get this long to answer (about 1 s and 4 s when idle;
the CI machine is shared)."""
POLL_S = 0.1
STOP_TIMEOUT_S = 15.0


def cache_dir() -> Path:
    """Where `make kube-binaries` leaves the binaries (tools/build-kube.sh)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpu-autoscaler" / f"kube-{KUBE_VERSION}"


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path


def find_binaries() -> Binaries | None:
    """Both binaries from the cache, or None when either is missing."""
    bin_dir = cache_dir() / "bin"
    found = Binaries(bin_dir / "kube-apiserver", bin_dir / "etcd")
    if all(os.access(path, os.X_OK) for path in (found.kube_apiserver, found.etcd)):
        return found
    return None


class StartFailed(RuntimeError):
    pass


@dataclass
class RealKube:
    """A running etcd and kube-apiserver. `start` returns once the API server is ready
    and KubeRay's CRDs are Established; `stop` ends both processes by pid."""

    binaries: Binaries
    workdir: Path = field(init=False)
    url: str = field(init=False, default="")
    admin_token: str = field(init=False, default="")
    ca_file: Path = field(init=False)
    timings: dict[str, float] = field(init=False, default_factory=dict)
    """Seconds each start phase took: certificates, etcd, kube-apiserver, crds."""
    _processes: dict[str, subprocess.Popen[bytes]] = field(init=False, default_factory=dict)

    def start(self) -> RealKube:
        # In memory where the machine has it: etcd fsyncs every write.
        shm = Path("/dev/shm")
        base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.workdir = Path(tempfile.mkdtemp(prefix="tpu-autoscaler-kube-", dir=base))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        began = time.monotonic()
        self._write_credentials()
        self.timings["certificates"] = time.monotonic() - began

        began = time.monotonic()
        etcd_port, peer_port = free_ports(2)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: _http_ok(f"{etcd_url}/health"))
        self.timings["etcd"] = time.monotonic() - began

        began = time.monotonic()
        (port,) = free_ports(1, besides={etcd_port, peer_port})
        self.url = f"https://127.0.0.1:{port}"
        pki = self.workdir / "pki"
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                "--insecure-port=0",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'serving.crt'}",
                f"--tls-private-key-file={pki / 'serving.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                "--disable-admission-plugins=ServiceAccount",
                # The `kubernetes` Service's endpoints would name this machine's
                # address; no pod here needs them.
                "--endpoint-reconciler-type=none",
                "--logtostderr=true",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", self._ready)
        self.timings["kube-apiserver"] = time.monotonic() - began

        began = time.monotonic()
        self._install_crds()
        self.timings["crds"] = time.monotonic() - began

    def stop(self) -> None:
        """SIGTERM to each process by pid (the API server first), SIGKILL to one that
        has not exited after `STOP_TIMEOUT_S`; then the directory goes."""
        for name in ("kube-apiserver", "etcd"):
            process = self._processes.pop(name, None)
            if process is None:
                continue
            if process.poll() is None:
                os.kill(process.pid, 15)
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    os.kill(process.pid, 9)
                    process.wait()
        if getattr(self, "workdir", None) is not None and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    # --- clients -----------------------------------------------------------------------

    def configuration(self, token: str | None = None) -> client.Configuration:
        """The official client's configuration for this server, as `token`'s user (the
        admin by default), verifying the serving certificate."""
        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": token or self.admin_token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        configuration.retries = False
        return configuration

    def api_client(self, token: str | None = None) -> client.ApiClient:
        return client.ApiClient(self.configuration(token))

    def kubeconfig(self, token: str, namespace: str) -> dict[str, Any]:
        """A kubeconfig for `token`'s user on this server (CA verified), `namespace` as
        its context's: what a process outside the cluster loads (`KUBECONFIG`)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": "autoscaler", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "local",
                    "context": {"cluster": "local", "user": "autoscaler", "namespace": namespace},
                }
            ],
            "current-context": "local",
        }

    # --- internals ---------------------------------------------------------------------

    def _write_credentials(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir()
        ca_key = _rsa_key()
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpu-autoscaler-test-ca")])
        ca = (
            _certificate(ca_name, ca_name, ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        serving_key = _rsa_key()
        serving_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
            x509.IPAddress(ipaddress.IPv4Address("10.0.0.1")),
        ]
        serving = (
            _certificate(serving_name, ca_name, serving_key.public_key())
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        sa_key = _rsa_key()
        self.ca_file = pki / "ca.crt"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        (pki / "serving.crt").write_bytes(serving.public_bytes(serialization.Encoding.PEM))
        (pki / "serving.key").write_bytes(_private_pem(serving_key))
        (pki / "sa.key").write_bytes(_private_pem(sa_key))
        (pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self.admin_token = secrets.token_hex(16)
        (pki / "tokens.csv").write_text(f'{self.admin_token},admin,admin,"system:masters"\n')

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        with log:
            self._processes[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )

    def _wait(self, name: str, ready: Callable[[], bool]) -> None:
        """Poll `ready` until it holds; fail with the log's tail if the process exits
        or `READY_TIMEOUT_S` passes first."""
        process = self._processes[name]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            if process.poll() is not None:
                raise StartFailed(
                    f"{name} exited with {process.returncode} before it was ready:\n"
                    + self._log_tail(name)
                )
            if time.monotonic() > deadline:
                raise StartFailed(
                    f"{name} not ready after {READY_TIMEOUT_S:g}s:\n" + self._log_tail(name)
                )
            time.sleep(POLL_S)

    def _log_tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _ready(self) -> bool:
        request = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return _http_ok(request, context)

    def _install_crds(self) -> None:
        with self.api_client() as api_client:
            extensions = client.ApiextensionsV1Api(api_client)
            crds = kube120.kuberay_crds_for_kube_1_20()
            for crd in crds:
                extensions.create_custom_resource_definition(crd, _preload_content=False)
            names = [crd["metadata"]["name"] for crd in crds]
            self._wait("kube-apiserver", lambda: all(_established(extensions, n) for n in names))
            # Established is set before the new resources are in discovery and routed.
            objects = client.CustomObjectsApi(api_client)
            plurals = [crd["spec"]["names"]["plural"] for crd in crds]
            self._wait("kube-apiserver", lambda: all(_served(objects, p) for p in plurals))


def _established(extensions: client.ApiextensionsV1Api, name: str) -> bool:
    crd = extensions.read_custom_resource_definition(name)
    conditions = (crd.status and crd.status.conditions) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def _served(objects: client.CustomObjectsApi, plural: str) -> bool:
    try:
        objects.list_cluster_custom_object("ray.io", "v1", plural, _preload_content=False)
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _http_ok(request: str | urllib.request.Request, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(request, timeout=2.0, context=context) as answer:
            status: int = answer.status
            return status == 200
    except (urllib.error.URLError, OSError):
        return False


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _private_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _certificate(subject: x509.Name, issuer: x509.Name, public_key: Any) -> x509.CertificateBuilder:
    """The common part; the caller adds extensions and signs."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
