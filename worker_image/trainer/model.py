"""A small GPT-style decoder (nanoGPT's shape) over byte tokens; with
`moe_experts`, each block's MLP is routed experts (trainer/moe.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.moe import MoE


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int = 256
    dropout: float = 0.0
    # Mixture of experts; 0 experts = the dense MLP.
    moe_experts: int = 0
    moe_top_k: int = 0
    moe_shared_experts: int = 0
    moe_hidden: int = 0
    moe_capacity_factor: float = 1.25
    moe_aux_loss_coef: float = 0.0


# Output projections into the residual stream, initialised smaller with depth
# (GPT-2): attention's, the dense MLP's, and the experts'.
SCALED_INIT = ("proj.weight", "mlp.2.weight", "mlp.w_out", "mlp.shared.2.weight")


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.n_head = shape.n_head
        self.qkv = nn.Linear(shape.n_embd, 3 * shape.n_embd, bias=False)
        self.proj = nn.Linear(shape.n_embd, shape.n_embd, bias=False)
        self.dropout = shape.dropout
        self.resid_drop = nn.Dropout(shape.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.n_embd)
        self.attn = CausalSelfAttention(shape)
        self.ln2 = nn.LayerNorm(shape.n_embd)
        if shape.moe_experts:
            self.mlp = MoE(shape.n_embd, shape.moe_hidden, shape.moe_experts, shape.moe_top_k,
                           shape.moe_shared_experts, shape.moe_capacity_factor, shape.dropout)
            return
        self.mlp = nn.Sequential(
            nn.Linear(shape.n_embd, 4 * shape.n_embd, bias=False),
            nn.GELU(),
            nn.Linear(4 * shape.n_embd, shape.n_embd, bias=False),
            nn.Dropout(shape.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.shape = shape
        self.wte = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.wpe = nn.Embedding(shape.block_size, shape.n_embd)
        self.drop = nn.Dropout(shape.dropout)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd)
        # Untied from wte: with 256 tokens tying saves nothing worth the
        # special cases it needs under FSDP and DCP.
        self.lm_head = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(SCALED_INIT):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * shape.n_layer) ** 0.5)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, MoE):
            nn.init.normal_(module.w_in, mean=0.0, std=0.02)
            nn.init.normal_(module.w_out, mean=0.0, std=0.02)

    @property
    def moe_layers(self) -> list[MoE]:
        return [block.mlp for block in self.blocks if isinstance(block.mlp, MoE)]

    def moe_stats(self) -> torch.Tensor:
        """The last forward's routing, one detached vector: per block [balance
        loss, dropped share, load share of each expert] (trainer/moe.py)."""
        return torch.cat([layer.stats for layer in self.moe_layers])

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        if not self.shape.moe_experts:
            return loss
        # The balance loss trains the router; it is no part of the language
        # model's loss, so evaluation (and the loss reported) leave it out.
        self.lm_loss = loss.detach()
        if not self.training or not self.shape.moe_aux_loss_coef:
            return loss
        return loss + self.shape.moe_aux_loss_coef * sum(m.aux for m in self.moe_layers)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> float:
        """Training FLOPs per token (6N plus attention), as in the PaLM appendix.
        N counts the parameters a token passes through: of the routed
        experts, its top k (capacity padding is overhead, not model FLOPs)."""
        s = self.shape
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        if s.moe_experts:
            idle = s.moe_experts - s.moe_top_k
            n -= s.n_layer * idle * 2 * s.n_embd * s.moe_hidden
        return 6 * n + 12 * s.n_layer * s.n_embd * s.block_size


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and embeddings, none on LayerNorm parameters."""
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
