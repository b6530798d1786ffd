"""Ray 2.60's stock KubeRay autoscaler (v2), run against a local API server.

`tpu-autoscaler local --policy ray` runs this module as a process next to a real Ray
head, so that Ray's own autoscaler can be recorded side by side with ours on the same
simulated control plane. Everything that decides is Ray's: the process runs Ray's
`run_kuberay_autoscaler` (what `ray kuberay-autoscaler` runs: health check, log
directory from the head's node info, Ray's logging, then `AutoscalerMonitor` with
`KubeRayConfigReader(AutoscalingConfigProducer(name, namespace))`). The only thing
replaced is how Ray's KubeRay code reaches the API server: `PlainHttpKubernetesClient`
sends Ray's requests, unchanged, to `http://host:port` (the simulated server) instead of
https://kubernetes.default with the pod's service-account token, or to a real local
server with the token and CA files given (`local --kubernetes real`).

    python -m tpu_autoscaler.local.stock --cluster-name N --cluster-namespace NS \\
        --gcs-address HOST:PORT --kube-url http://127.0.0.1:PORT \\
        [--kube-token-file FILE --kube-ca-file FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import requests
from ray.autoscaler._private.kuberay import node_provider
from ray.autoscaler._private.kuberay.node_provider import (
    KUBERAY_CRD_VER,
    KUBERAY_REQUEST_TIMEOUT_S,
    IKubernetesHttpApiClient,
)
from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay import cloud_provider

JSON_PATCH = "application/json-patch+json"
CLIENT_NAME = "KubernetesHttpApiClient"
"""The name Ray's KubeRay modules build their API client by."""


class PlainHttpKubernetesClient(IKubernetesHttpApiClient):  # type: ignore[misc]
    """Ray's `KubernetesHttpApiClient` without TLS and credentials: the same URLs
    (`url_from_resource`'s, under `base_url`), bodies, headers, timeout and status
    handling (`raise_for_status` unless GET/PATCH answer 200 or DELETE 200/202, so a
    failure is the `requests.HTTPError` Ray's retries and error paths expect)."""

    def __init__(
        self,
        base_url: str,
        namespace: str,
        kuberay_crd_version: str = KUBERAY_CRD_VER,
        timeout_s: float = KUBERAY_REQUEST_TIMEOUT_S,
        *,
        token_file: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the API server URL needs a scheme: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.namespace = namespace
        self.kuberay_crd_version = kuberay_crd_version
        self.timeout_s = timeout_s
        self.token_file = token_file
        self.ca_file = ca_file

    def _credentials(self) -> dict[str, Any]:
        """As Ray's `load_k8s_secrets`, from the files given (a real API server's
        service-account token and CA), read at every request as Ray reads its own;
        nothing for a plain-HTTP server."""
        headers: dict[str, str] = {}
        if self.token_file is not None:
            with open(self.token_file) as token:
                headers["Authorization"] = "Bearer " + token.read().strip()
        return {"headers": headers, "verify": self.ca_file or True}

    def url(self, path: str) -> str:
        """As Ray's `url_from_resource`: `path` starts with the resource type."""
        if path.startswith("pods"):
            api_group = "/api/v1"
        elif path.startswith("rayclusters"):
            api_group = "/apis/ray.io/" + self.kuberay_crd_version
        else:
            raise NotImplementedError(f"Tried to access unknown entity at {path}")
        return f"{self.base_url}{api_group}/namespaces/{self.namespace}/{path}"

    def get(self, path: str) -> dict[str, Any]:
        result = requests.get(self.url(path), timeout=self.timeout_s, **self._credentials())
        if result.status_code != 200:
            result.raise_for_status()
        body: dict[str, Any] = result.json()
        return body

    def patch(
        self,
        path: str,
        payload: list[dict[str, Any]] | dict[str, Any],
        content_type: str = JSON_PATCH,
    ) -> dict[str, Any]:
        credentials = self._credentials()
        credentials["headers"]["Content-type"] = content_type
        result = requests.patch(
            self.url(path), json.dumps(payload), timeout=self.timeout_s, **credentials
        )
        if result.status_code != 200:
            result.raise_for_status()
        body: dict[str, Any] = result.json()
        return body

    def delete(self, path: str) -> dict[str, Any]:
        result = requests.delete(self.url(path), timeout=self.timeout_s, **self._credentials())
        if result.status_code not in (200, 202):
            result.raise_for_status()
        body: dict[str, Any] = result.json()
        return body


def use_plain_http(
    kube_url: str, token_file: str | None = None, ca_file: str | None = None
) -> Callable[[], None]:
    """Make Ray's KubeRay code in this process build `PlainHttpKubernetesClient`s for
    `kube_url`; returns a function that undoes it.

    Why patch at all: Ray builds its client itself, by name, and that client insists on
    HTTPS (`url_from_resource` refuses http://) and reads the in-cluster token and CA
    from /var/run/secrets, none of which a local simulated API server has. Ray offers
    no setting for this, so the two names it builds the client by are replaced, and
    nothing else:
    - `node_provider.KubernetesHttpApiClient`, which `AutoscalingConfigProducer` (the
      RayCluster -> autoscaling config reader) looks up through the module at call time
      (and the v1 `KubeRayNodeProvider`, not used by v2);
    - `cloud_provider.KubernetesHttpApiClient`, bound by `from ... import` in the v2
      `KubeRayProvider`'s module, which `Autoscaler` builds without a client (the IPPR
      provider gets that same client).
    """
    factory = partial(PlainHttpKubernetesClient, kube_url, token_file=token_file, ca_file=ca_file)
    modules = (node_provider, cloud_provider)
    originals = [getattr(module, CLIENT_NAME) for module in modules]
    if not isinstance(originals[0], type) or any(o is not originals[0] for o in originals):
        raise RuntimeError(f"Ray's {CLIENT_NAME} is already replaced in this process")

    for module in modules:
        setattr(module, CLIENT_NAME, factory)

    def undo() -> None:
        for module, original in zip(modules, originals, strict=True):
            setattr(module, CLIENT_NAME, original)

    return undo


def _ray_cli_on_path() -> None:
    """`run_kuberay_autoscaler` health-checks the head with `ray health-check` from
    PATH: make that this interpreter's Ray, also when its venv is not activated."""
    bin_dir = os.path.dirname(sys.executable)
    if os.access(os.path.join(bin_dir, "ray"), os.X_OK):
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tpu_autoscaler.local.stock",
        description="Run Ray's stock KubeRay autoscaler against a plain-HTTP API server.",
    )
    parser.add_argument("--cluster-name", required=True, help="the RayCluster's name")
    parser.add_argument("--cluster-namespace", required=True, help="the RayCluster's namespace")
    parser.add_argument(
        "--gcs-address",
        default=None,
        help="HOST:PORT of the head's GCS (Ray's default: this node's IP, port 6379)",
    )
    parser.add_argument(
        "--kube-url", required=True, help="the API server, e.g. http://127.0.0.1:8001"
    )
    parser.add_argument(
        "--kube-token-file", help="a bearer token to send (a real API server's service account)"
    )
    parser.add_argument("--kube-ca-file", help="the CA of an https:// server's certificate")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    use_plain_http(args.kube_url, args.kube_token_file, args.kube_ca_file)
    _ray_cli_on_path()
    # Imported late, as `ray kuberay-autoscaler` does.
    from ray.autoscaler._private.kuberay.run_autoscaler import run_kuberay_autoscaler

    # Waits for the GCS (`ray health-check`), logs to the head's session logs
    # (monitor.log), stdout and stderr, then runs Ray's monitor loop: it does not
    # return; an error in the loop is raised, as in the autoscaler container.
    run_kuberay_autoscaler(args.cluster_name, args.cluster_namespace, args.gcs_address)
    return 0


if __name__ == "__main__":
    sys.exit(main())
