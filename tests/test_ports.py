"""Ports picked for the processes started on this machine (Ray's head and hosts in
`local` mode, a real kube-apiserver and etcd) are distinct: a port picked and released
at once can come back from the next pick, and a Ray head once failed to start because
its dashboard agent and its metrics exporter were given the same one."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from tpu_autoscaler.controlplane import ports


class ReusingKernel:
    """Binds port 0 to the lowest port not bound now, as a kernel may hand out a port
    released a moment ago."""

    def __init__(self) -> None:
        self.bound: set[int] = set()

    def socket(self) -> _Socket:
        return _Socket(self)


class _Socket:
    def __init__(self, kernel: ReusingKernel) -> None:
        self.kernel = kernel
        self.port = 0

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *_: Any) -> None:
        self.kernel.bound.discard(self.port)

    def bind(self, address: tuple[str, int]) -> None:
        assert address == (ports.LOOPBACK, 0)
        self.port = next(p for p in itertools.count(40000) if p not in self.kernel.bound)
        self.kernel.bound.add(self.port)

    def getsockname(self) -> tuple[str, int]:
        return (ports.LOOPBACK, self.port)


def test_ports_picked_together_are_distinct_even_from_a_kernel_that_reuses_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = ReusingKernel()
    monkeypatch.setattr(ports, "socket", SimpleNamespace(socket=kernel.socket))
    assert ports.free_ports(5) == [40000, 40001, 40002, 40003, 40004]
    assert not kernel.bound  # all released once picked
    assert ports.free_ports(3, besides={40000, 40002}) == [40001, 40003, 40004]
    assert ports.free_port() == 40000


def test_ports_picked_on_this_machine_are_distinct_and_free() -> None:
    picked = ports.free_ports(20)
    assert len(set(picked)) == 20
    assert not set(ports.free_ports(5, besides=picked)) & set(picked)
