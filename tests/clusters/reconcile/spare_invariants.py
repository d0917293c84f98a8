"""The spare pool's invariants, checked from the database after every step
of a test (tests/clusters/reconcile/test_spare_paths.py, test_spare_interleavings.py):

- a pool never has more working nodes than its size;
- every promotion names the node it replaces;
- the node a promotion names was a working node (a failed spare is replaced
  as a spare, never by a promotion into the working set);
- one failure, one spare: a node is named by one promotion per stay out of
  service.
"""

from __future__ import annotations

from clusters.models import Node, NodeEvent

PROMOTED = "promoted from the spare pool"
WORKING = ("provisioning", "ready")


class PoolWatch:
    """Reads the pool after each step and asserts the invariants; remembers
    the promotions it has seen, and which nodes already have a successor."""

    def __init__(self, pool):
        self.pool = pool
        self.seen: set[int] = set()
        self.filled: set[str] = set()  # nodes with a successor in their stay out

    def working(self) -> list[str]:
        return sorted(Node.objects.filter(pool=self.pool, is_spare=False, state__in=WORKING)
                      .values_list("name", flat=True))

    def check(self, step: str = "") -> None:
        self.pool.refresh_from_db()
        where = f" after {step}" if step else ""
        working = self.working()
        assert len(working) <= self.pool.size, (
            f"{len(working)} working nodes in a pool of {self.pool.size}{where}: {working}")
        # A node back in service starts a new stay: it may be owed a spare again.
        self.filled -= set(working)
        new = (NodeEvent.objects.filter(node__pool=self.pool, reason__startswith=PROMOTED)
               .exclude(pk__in=self.seen).select_related("node").order_by("id"))
        for event in new:
            self.seen.add(event.pk)
            named = (event.evidence or {}).get("replaces")
            assert named, f"{event.node.name} was promoted naming no node{where}"
            replaced = Node.objects.get(pool=self.pool, name=named)
            assert not replaced.is_spare, (
                f"{event.node.name} was promoted into the working set for the spare "
                f"{named}{where}")
            assert replaced.state not in WORKING, (
                f"{event.node.name} was promoted for {named}, which is {replaced.state}{where}")
            assert named not in self.filled, (
                f"{named} got a second spare ({event.node.name}){where}")
            self.filled.add(named)
