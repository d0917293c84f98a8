"""Which free nodes a gang takes: with the pool's `topology_label` set (a
placement group, rack or EFA topology block, as a node label), the gang is
kept within one value of it when one value has room for it whole, the
fullest-fitting value first (best fit, so the big blocks stay free for big
gangs); otherwise the values with the most free nodes first, so it spans as
few as it can. Without the label, nodes go by name.
"""

from __future__ import annotations

from collections import Counter, defaultdict

NO_VALUE = ""


def _value(node, label: str) -> str:
    return str((node.labels or {}).get(label, NO_VALUE))


def order(nodes: list, label: str, num_nodes: int, prefer=()) -> list:
    """`nodes` in the order a gang of `num_nodes` should take them. Nodes in
    `prefer` (a relaunch's own nodes and their replacements) come first, then
    nodes sharing their label values."""
    preferred = set(prefer)
    if not label:
        return sorted(nodes, key=lambda n: (n.id not in preferred, n.name))
    groups: dict[str, list] = defaultdict(list)
    for node in nodes:
        groups[_value(node, label)].append(node)
    kept = {_value(n, label) for n in nodes if n.id in preferred}
    fits = [v for v, members in groups.items() if len(members) >= num_nodes]

    def rank(value: str):
        size = len(groups[value])
        return (value not in kept, value == NO_VALUE,
                # one value that fits, the tightest first; else the biggest first
                0 if value in fits else 1, size if value in fits else -size, value)

    ranked = {v: i for i, v in enumerate(sorted(groups, key=rank))}
    return sorted(nodes, key=lambda n: (n.id not in preferred, ranked[_value(n, label)],
                                        n.name))


def describe(nodes: list, label: str) -> dict:
    """What the attempt records: the label and the nodes per value."""
    if not label:
        return {}
    counts = Counter(_value(n, label) for n in nodes)
    return {"label": label, "nodes_per_value": dict(sorted(counts.items())),
            "values": len(counts)}
