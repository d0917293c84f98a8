"""Routed experts: the feed-forward of the -moe presets (docs/trainer.md, "Mixture of experts").

Per block, on each rank's micro-batch of T tokens:

- **router**: a linear map to E logits, softmax in fp32.
- **top-k**: each token picks its k most probable experts. Their gates are
  the raw probabilities (Switch, GShard), not renormalised over the k, so
  the router learns from the language-model loss even at k = 1.
- **capacity**: an expert takes at most C = ceil(capacity_factor * k * T / E)
  assignments. Places go by choice first (every token's first choice before
  any token's second), then by token order, as in GShard: a token loses its
  second expert before any token loses its first. An assignment past C is
  dropped: that expert adds nothing for that token, which goes on through
  the residual and its other experts.
- **load-balancing loss** (Switch Transformer, eq. 4, over the k choices):
  aux = E * sum_e f_e * P_e, where f_e is the share of the T*k assignments
  that chose e (before capacity) and P_e the mean probability the router
  gave e. Perfect balance gives 1.0; all tokens on one expert gives E.

The dispatch has fixed shapes and never waits for the host: every kept
assignment gets a slot `expert * C + place` of an (E, C) buffer, the buffer
is filled by one gather from the tokens (an empty slot reads a zero row,
and an expert without bias maps zero to zero), all experts run as one
batched matmul, and each token gathers its k outputs back. Gathers only:
their backward on CPU (index_add_) is deterministic, so runs resume
bitwise. The one scatter fills the slot table, at unique slots except for
the dropped assignments, which all land in one extra slot that is thrown
away.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def capacity(tokens: int, experts: int, top_k: int, factor: float) -> int:
    """Assignments one expert takes from a micro-batch of `tokens` tokens."""
    return max(1, math.ceil(factor * tokens * top_k / experts))


def route(probs: torch.Tensor, top_k: int, cap: int):
    """The routing of T tokens given their (T, E) router probabilities.

    Returns, for the T*k assignments in choice-major order (assignment
    a = choice * T + token): the expert, the gate, the slot in the (E*cap)
    buffer (E*cap when dropped), and whether it was kept; and the
    assignments each expert was given before capacity (E,)."""
    t, e = probs.shape
    gates, experts = probs.topk(top_k, dim=-1)  # (T, k), ties to the lower index
    experts = experts.t().reshape(-1)  # choice-major
    gates = gates.t().reshape(-1)
    chosen = F.one_hot(experts, e)  # (T*k, E)
    place = (chosen.cumsum(0) * chosen).sum(1) - 1
    kept = place < cap
    slots = torch.where(kept, experts * cap + place, torch.full_like(place, e * cap))
    return experts, gates, slots, kept, chosen.sum(0)


def balance_loss(probs: torch.Tensor, counts: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch Transformer's load-balancing loss over k choices (1.0 when even)."""
    t, e = probs.shape
    share = counts.to(probs.dtype) / (t * top_k)
    return e * (share * probs.mean(0)).sum()


class MoE(nn.Module):
    """Routed experts (plus optional shared ones) in place of a block's MLP.

    After each forward, `aux` holds the block's balance loss (part of the
    autograd graph) and `stats` a detached vector [aux, dropped share, load
    share of each expert], read by the trainer on log steps only."""

    def __init__(self, n_embd: int, hidden: int, experts: int, top_k: int, shared: int,
                 capacity_factor: float, dropout: float):
        super().__init__()
        self.experts, self.top_k, self.capacity_factor = experts, top_k, capacity_factor
        self.router = nn.Linear(n_embd, experts, bias=False)
        self.w_in = nn.Parameter(torch.empty(experts, n_embd, hidden))
        self.w_out = nn.Parameter(torch.empty(experts, hidden, n_embd))
        # Shared experts see every token: one MLP as wide as all of them.
        self.shared = nn.Sequential(
            nn.Linear(n_embd, shared * hidden, bias=False),
            nn.GELU(),
            nn.Linear(shared * hidden, n_embd, bias=False),
        ) if shared else None
        self.drop = nn.Dropout(dropout)
        self.aux: torch.Tensor | None = None
        self.stats: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        tokens = x.reshape(b * t, c)
        n = b * t
        cap = capacity(n, self.experts, self.top_k, self.capacity_factor)
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        _, gates, slots, kept, counts = route(probs, self.top_k, cap)
        # Which token fills each slot; n (a zero row) where none does.
        source = torch.full((self.experts * cap + 1,), n, dtype=torch.long, device=x.device)
        source.scatter_(0, slots, torch.arange(n, device=x.device).repeat(self.top_k))
        padded = torch.cat([tokens, tokens.new_zeros(1, c)])
        h = padded[source[:-1]].view(self.experts, cap, c)
        h = torch.bmm(F.gelu(torch.bmm(h, self.w_in.to(h.dtype))), self.w_out.to(h.dtype))
        h = torch.cat([h.reshape(-1, c), h.new_zeros(1, c)])
        weight = (gates * kept).to(h.dtype).unsqueeze(1)
        y = (h[slots] * weight).view(self.top_k, n, c).sum(0)
        if self.shared is not None:
            y = y + self.shared(tokens)
        self.aux = balance_loss(probs, counts, self.top_k)
        assignments = n * self.top_k
        self.stats = torch.cat([
            self.aux.detach().reshape(1),
            ((assignments - kept.sum()) / assignments).reshape(1).float(),
            counts.float() / assignments,
        ])
        return self.drop(y.view(b, t, c))


def expert_metrics(stats: list[float], n_layer: int, experts: int) -> dict[str, float]:
    """Metric points from a flat [per block: aux, dropped, loads...] vector."""
    points: dict[str, float] = {}
    width = 2 + experts
    for layer in range(n_layer):
        row = stats[layer * width:(layer + 1) * width]
        points[f"moe/layer{layer}/aux_loss"] = row[0]
        points[f"moe/layer{layer}/dropped"] = row[1]
        for e, share in enumerate(row[2:]):
            points[f"moe/layer{layer}/expert{e}_load"] = share
    points["moe/aux_loss"] = sum(stats[layer * width] for layer in range(n_layer))
    points["moe/dropped"] = sum(stats[layer * width + 1] for layer in range(n_layer)) / n_layer
    return points
