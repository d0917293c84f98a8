"""Host buffers for async saves: allocated at the first save, reused after,
and each save a true copy (regatta/staging.py). DTensor shards go through
the FSDP resume test (tests/worker_image/test_resume.py), whose step-8
checkpoint is an async save."""

import pytest
import torch
from regatta.staging import HostBuffers, reused_buffers_factory

pytestmark = [pytest.mark.timeout(30)]


def state(weight: torch.Tensor, lr: float) -> dict:
    return {"model": {"w": weight}, "optim": {"state": {0: {"step": torch.tensor(3.0)}},
                                              "param_groups": [{"lr": lr, "params": [0]}]}}


def test_a_staged_copy_does_not_change_when_training_goes_on():
    weight = torch.ones(4, 4)
    staged = HostBuffers(pin_memory=False).stage(state(weight, 0.1))

    weight.add_(1.0)  # the next optimizer step, in place

    assert torch.equal(staged["model"]["w"], torch.ones(4, 4))
    assert staged["model"]["w"].data_ptr() != weight.data_ptr()


def test_later_saves_copy_into_the_same_buffers_and_take_fresh_non_tensor_values():
    buffers = HostBuffers(pin_memory=False)
    weight = torch.zeros(8)
    first = buffers.stage(state(weight, 0.1))
    first_ptr = first["model"]["w"].data_ptr()
    weight.fill_(2.0)

    second = buffers.stage(state(weight, 0.05))

    assert second["model"]["w"].data_ptr() == first_ptr  # no new allocation
    assert torch.equal(second["model"]["w"], torch.full((8,), 2.0))
    assert second["optim"]["param_groups"][0]["lr"] == 0.05
    assert second["optim"]["state"][0]["step"].item() == 3.0


def test_a_tensor_whose_shape_changed_gets_a_new_buffer():
    buffers = HostBuffers(pin_memory=False)
    small = buffers.stage({"w": torch.zeros(2)})["w"]

    grown = buffers.stage({"w": torch.arange(5.0)})["w"]

    assert grown.shape == (5,) and torch.equal(grown, torch.arange(5.0))
    assert grown.data_ptr() != small.data_ptr()


def test_every_stager_the_factory_makes_shares_the_runs_buffers():
    factory = reused_buffers_factory(torch.device("cpu"))
    a, b = factory(), factory()
    a.close()  # closing one (as Checkpointer does after each save) keeps the buffers

    assert a.buffers is b.buffers
    assert b.stage({"w": torch.ones(3)})["w"].sum().item() == 3.0
