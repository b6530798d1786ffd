"""The `kube_real` tier: a real kube-apiserver 1.20.2 and etcd (see cluster.py), started
once per session, skipped with one line where `make kube-binaries` has not been run
(failed instead where TPU_AUTOSCALER_REQUIRE_KUBE_REAL is set)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tpu_autoscaler.controlplane.real_kube import HOW_TO_GET, Binaries, RealKube, find_binaries

REQUIRE_ENV = "TPU_AUTOSCALER_REQUIRE_KUBE_REAL"
"""Set (CI): missing binaries fail the tier instead of skipping it."""


@pytest.fixture(scope="session")
def kube_binaries() -> Binaries:
    """The binaries `make kube-binaries` built; the tier skips (or fails, in CI) without."""
    binaries = find_binaries()
    if binaries is None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set but there are {HOW_TO_GET}", pytrace=False)
        pytest.skip(HOW_TO_GET)  # each skip is reported at this line: see below
    return binaries


@pytest.fixture(scope="session")
def real_kube(kube_binaries: Binaries) -> Iterator[RealKube]:
    kube = RealKube(kube_binaries).start()
    try:
        yield kube
    finally:
        kube.stop()


@pytest.fixture
def admin(real_kube: RealKube) -> Iterator[client.ApiClient]:
    """The official client as the cluster's admin (system:masters)."""
    with real_kube.api_client() as api_client:
        yield api_client


@pytest.fixture
def namespace(admin: client.ApiClient, request: pytest.FixtureRequest) -> str:
    """A namespace of the test's own (never deleted: no namespace controller runs)."""
    stem = request.node.name.lower().replace("_", "-")
    stem = "".join(c if c.isalnum() or c == "-" else "-" for c in stem)[:40].strip("-")
    name = f"{stem}-{secrets.token_hex(3)}"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture
def account_client(real_kube: RealKube) -> Iterator[Callable[[str], client.ApiClient]]:
    """An API client per token, closed at the end of the test."""
    opened: list[client.ApiClient] = []

    def open_for(token: str) -> client.ApiClient:
        assert token and token != real_kube.admin_token
        opened.append(real_kube.api_client(token))
        return opened[-1]

    yield open_for
    for api_client in opened:
        api_client.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, Any]:
    """Every test skipped for want of the binaries reported at one place, the skip in
    `real_kube`, so that `-ra` folds them into one line (pytest reports a skip raised
    in a fixture at each test's own line)."""
    report = yield
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and longrepr[2].endswith(HOW_TO_GET):
        report.longrepr = (str(Path(__file__)), _SKIP_LINE, longrepr[2])
    return report


_SKIP_LINE = next(
    number
    for number, line in enumerate(Path(__file__).read_text().splitlines(), 1)
    if "pytest.skip(HOW_TO_GET)" in line
)
