"""The experts' router on hand-computed cases, and the MoE knobs of the config."""

import pytest
import torch
from trainer.config import ConfigError, TrainerConfig
from trainer.model import GPT, GPTShape
from trainer.moe import MoE, balance_loss, capacity, expert_metrics, route

pytestmark = [pytest.mark.timeout(60)]

PROBS = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])


def test_top_1_routing_drops_the_tokens_past_an_expert_s_capacity():
    experts, gates, slots, kept, counts = route(PROBS, top_k=1, cap=2)

    assert experts.tolist() == [0, 0, 1, 0]
    assert gates.tolist() == pytest.approx([0.9, 0.8, 0.7, 0.6])
    assert counts.tolist() == [3, 1]  # before capacity
    # Expert 0 fills its two places in token order; token 3 is dropped into
    # the discarded slot 2 * 2.
    assert kept.tolist() == [True, True, True, False]
    assert slots.tolist() == [0, 1, 2, 4]


def test_top_2_routing_places_every_first_choice_before_any_second():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.3, 0.5]])
    experts, _, slots, kept, counts = route(probs, top_k=2, cap=1)

    # Choice-major: first choices of tokens 0, 1, 2, then their second choices.
    assert experts.tolist() == [0, 1, 2, 1, 2, 1]
    assert counts.tolist() == [1, 3, 2]
    assert kept.tolist() == [True, True, True, False, False, False]
    assert slots.tolist() == [0, 1, 2, 3, 3, 3]


def test_the_balance_loss_matches_the_hand_computed_value():
    counts = torch.tensor([3, 1])
    # E * sum(f * P) = 2 * (0.75 * 0.65 + 0.25 * 0.35)
    assert balance_loss(PROBS, counts, top_k=1).item() == pytest.approx(1.15)
    even = torch.full((4, 2), 0.5)
    assert balance_loss(even, torch.tensor([2, 2]), top_k=1).item() == pytest.approx(1.0)
    assert capacity(tokens=512, experts=8, top_k=2, factor=1.25) == 160


def reference(moe: MoE, x: torch.Tensor, cap: int) -> torch.Tensor:
    """Token by token: each kept assignment's expert, weighted by its gate."""
    tokens = x.reshape(-1, x.size(-1))
    probs = torch.softmax(moe.router(tokens), -1)
    out = torch.zeros_like(tokens)
    used = [0] * moe.experts
    for choice in range(moe.top_k):
        for t in range(len(tokens)):
            e = probs[t].topk(moe.top_k).indices[choice].item()
            used[e] += 1
            if used[e] > cap:
                continue
            h = torch.nn.functional.gelu(tokens[t] @ moe.w_in[e]) @ moe.w_out[e]
            out[t] += probs[t, e] * h
    return (out + moe.shared(tokens)).view_as(x)


def test_the_batched_dispatch_equals_routing_token_by_token():
    torch.manual_seed(0)
    moe = MoE(n_embd=8, hidden=6, experts=4, top_k=2, shared=1, capacity_factor=0.5,
              dropout=0.0)
    for p in (moe.w_in, moe.w_out):
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(2, 5, 8)

    y = moe(x)

    cap = capacity(10, 4, 2, 0.5)
    assert cap == 3
    torch.testing.assert_close(y, reference(moe, x, cap))
    aux, dropped, *loads = moe.stats.tolist()
    assert dropped > 0 and sum(loads) == pytest.approx(1.0) and aux >= 1.0 - 1e-6
    # 20 assignments, at most 3 places for each of 4 experts.
    assert dropped >= (20 - 12) / 20


def test_the_moe_model_adds_the_weighted_balance_loss_in_training_only():
    torch.manual_seed(0)
    shape = GPTShape(n_layer=2, n_head=2, n_embd=16, block_size=8, moe_experts=4,
                     moe_top_k=2, moe_shared_experts=1, moe_hidden=8, moe_aux_loss_coef=0.5)
    model = GPT(shape)
    x = torch.randint(0, 256, (2, 8))

    loss = model(x, x)
    aux = sum(layer.aux for layer in model.moe_layers)
    assert loss.item() == pytest.approx(model.lm_loss.item() + 0.5 * aux.item())
    loss.backward()
    assert model.blocks[0].mlp.router.weight.grad.abs().sum() > 0
    assert model.moe_stats().shape == (2 * (2 + 4),)
    model.eval()
    assert model(x, x).item() == model.lm_loss.item()


def test_expert_metrics_are_named_per_layer_and_expert():
    points = expert_metrics([1.1, 0.1, 0.75, 0.25, 0.9, 0.0, 0.5, 0.5], n_layer=2, experts=2)

    assert points["moe/layer0/expert0_load"] == 0.75
    assert points["moe/layer1/expert1_load"] == 0.5
    assert points["moe/layer0/dropped"] == 0.1
    assert points["moe/aux_loss"] == pytest.approx(2.0)
    assert points["moe/dropped"] == pytest.approx(0.05)
    assert max(len(name) for name in points) <= 64  # the control plane's limit


def test_the_moe_presets_fill_in_their_experts_and_dense_presets_have_none():
    cfg = TrainerConfig.from_dict({"model": "nano-moe"})
    assert cfg.arch() == {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64}
    assert cfg.moe() == {"moe_experts": 8, "moe_top_k": 2, "moe_shared_experts": 1,
                         "moe_hidden": 64, "moe_capacity_factor": 1.25,
                         "moe_aux_loss_coef": 0.01}
    assert TrainerConfig.from_dict({"model": "nano"}).moe() is None
    # Experts on a dense preset: the hidden width defaults to 4 * n_embd / top_k.
    assert TrainerConfig.from_dict({"model": "nano", "moe_experts": 4}).moe()["moe_hidden"] \
        == 128
    assert TrainerConfig.from_dict({"model": "nano-moe", "moe_experts": 0}).moe() is None


@pytest.mark.parametrize("raw, message", [
    ({"model": "nano-moe", "moe_top_k": 9}, r"moe_top_k=9 must be within \[1, moe_experts=8\]"),
    ({"model": "nano-moe", "moe_top_k": 0}, r"moe_top_k=0 must be within"),
    ({"model": "nano", "moe_top_k": 2}, "moe_top_k=2 needs moe_experts >= 1"),
    ({"moe_experts": -1}, "moe_experts=-1 must not be negative"),
    ({"model": "nano-moe", "moe_capacity_factor": 0}, "moe_capacity_factor=0.0 must be positive"),
    ({"model": "nano-moe", "moe_aux_loss_coef": -1}, "moe_aux_loss_coef=-1.0 must not be"),
    ({"model": "nano-moe", "moe_hidden": 0}, "moe_hidden=0 must be at least 1"),
    ({"model": "nano-moe", "moe_shared_experts": -2}, "moe_shared_experts=-2 must not be"),
    ({"model": "nano-moe", "moe_experts": "8"}, "moe_experts='8' has the wrong type"),
])
def test_it_rejects_bad_expert_knobs_by_name(raw, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig.from_dict(raw)
