"""Free TCP ports on the loopback for the processes this package starts on one machine
(a real kube-apiserver and etcd, Ray's head and hosts in `local` mode), which would
otherwise collide on their fixed defaults."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Collection

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int, besides: Collection[int] = ()) -> list[int]:
    """`count` ports free now, distinct from one another and from `besides`. Each is
    held bound until all are picked: a port picked and released at once can be handed
    out again by the next pick (two of one Ray's agents were once given one port)."""
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        while len(ports) < count:
            probe = held.enter_context(socket.socket())
            probe.bind((LOOPBACK, 0))
            port: int = probe.getsockname()[1]
            if port not in besides:
                ports.append(port)
    return ports
