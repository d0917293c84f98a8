"""The test clusters' ports: distinct, free, and out of the kernel's
ephemeral range (testcluster/ports.py)."""

import socket

from testcluster import ports


def test_a_clusters_ports_are_distinct_free_and_below_the_ephemeral_range():
    start = ports._ephemeral_start()
    for _ in range(20):
        picked = ports.free_ports(12)
        assert len(set(picked)) == 12
        assert all(ports.FLOOR <= p < start for p in picked), picked
    for port in picked:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if the pick left it taken


def test_a_port_something_listens_on_is_never_picked():
    listening = []
    try:
        # Most of a narrow band taken: picks must step around them.
        for port in range(ports.FLOOR, ports.FLOOR + 200):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            sock.listen()
            listening.append(sock)
        taken = {s.getsockname()[1] for s in listening}
        for _ in range(50):
            assert not taken & set(ports.free_ports(8))
    finally:
        for sock in listening:
            sock.close()
