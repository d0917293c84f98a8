"""Loopback ports for the test clusters' daemons (Kubernetes here, Slurm in
slurmcluster/).

Each daemon is told its port on its command line and binds it itself, up
to minutes later on a busy machine. So all of a cluster's ports are picked
together and distinct: two picks of port 0 one after the other can return
the same port once the first socket is closed (CI saw etcd and JobSet's
webhook server handed one port, and JobSet exit on "address already in
use"). And they are picked below the kernel's ephemeral range, which is
where every bind to port 0 and every outgoing connection on the machine
takes its port (the suite's other worker, the clusters' own clients): none
of those can take one of ours in between.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Above the well-known and registered-by-habit ports most services listen on.
FLOOR = 20000
_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that nothing listens on now."""
    held: list[socket.socket] = []
    ports: list[int] = []
    rng = random.SystemRandom()
    top = _ephemeral_start()
    try:
        tries = 0
        while len(ports) < count and top - FLOOR >= 1000 and tries < 50 * count:
            tries += 1
            port = rng.randrange(FLOOR, top)
            if port in ports:
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
            ports.append(port)
        # A machine whose ephemeral range starts low: the kernel's choice,
        # each socket held open until all are picked so none repeats.
        while len(ports) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in held:
            sock.close()
    return ports
