"""A rank started on a node with fewer GPUs than ranks is told what to change.

CUDA itself said only "invalid device ordinal" (or, with two ranks on one
GPU, NCCL's "Duplicate GPU detected"). There is no GPU here, so the node's
device count is the one thing faked: torch.cuda.device_count is patched."""

import pytest
import torch
from regatta.dist import EXIT_CODE_ERROR, classify, cuda_device


def test_each_local_rank_takes_the_gpu_of_its_number(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert cuda_device(0) == torch.device("cuda", 0)
    assert cuda_device(7) == torch.device("cuda", 7)


def test_a_rank_past_the_node_gpus_is_refused_saying_what_to_change(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(RuntimeError) as refused:
        cuda_device(1)
    message = str(refused.value)
    assert "LOCAL_RANK 1 has no GPU of its own" in message
    assert "1 CUDA device(s) (CUDA_VISIBLE_DEVICES=3)" in message
    assert "--nproc-per-node" in message
    # A launch mistake: relaunching the same gang cannot fix it.
    assert classify(refused.value) == EXIT_CODE_ERROR
