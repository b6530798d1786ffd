"""Faults for queued-provisioning tests: request writes that fail after their
PodTemplate was made while the autoscaler restarts every few rounds (a new process,
`SimulatedCluster.new_autoscaler_process`)."""

from __future__ import annotations

from typing import Any

from tpu_autoscaler.adapters.kube.api import Unavailable
from tpu_autoscaler.shell.controller import Autoscaler, Round
from tpu_autoscaler.sim.cluster import SimulatedCluster


def failing_writes_and_restarts(sim: SimulatedCluster, fail_every: int, restart_every: int) -> None:
    """Every `fail_every`-th ProvisioningRequest create fails (its PodTemplate made),
    and every `restart_every`-th round is a new process's."""
    assert sim.queued is not None
    objects = sim.queued.objects
    create = objects.create_provisioning_request
    calls = [0]

    def failing(namespace: str, obj: Any) -> dict[str, Any]:
        calls[0] += 1
        if calls[0] % fail_every == 1:
            raise Unavailable("lost")
        return create(namespace, obj)

    objects.create_provisioning_request = failing  # type: ignore[method-assign]
    rounds = [0]

    def counted(autoscaler: Autoscaler) -> Autoscaler:
        step = autoscaler.step

        def counting() -> Round:
            rounds[0] += 1
            if rounds[0] % restart_every == 0:
                sim.autoscaler = counted(sim.new_autoscaler_process())
            return step()

        autoscaler.step = counting  # type: ignore[method-assign]
        return autoscaler

    sim.autoscaler = counted(sim.autoscaler)
