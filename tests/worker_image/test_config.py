"""The config rejects unknown keys and impossible combinations, naming them."""

import pytest
from trainer.config import ConfigError, TrainerConfig

pytestmark = [pytest.mark.timeout(30)]


def test_it_rejects_unknown_keys_by_name():
    with pytest.raises(ConfigError, match="unknown config keys: batchsize, lrr"):
        TrainerConfig.from_dict({"lrr": 1, "batchsize": 2, "lr": 0.1})


@pytest.mark.parametrize("raw, message", [
    ({"n_embd": 100, "n_head": 3}, "n_embd=100 is not divisible by n_head=3"),
    ({"warmup_steps": 50, "max_steps": 50}, "warmup_steps=50 must be below max_steps=50"),
    ({"val_every_steps": 5, "val_batches": 0}, "val_every_steps=5 needs val_batches >= 1"),
    ({"strategy": "zero3"}, "strategy='zero3' is not one of"),
    ({"dtype": "fp16"}, "dtype='fp16' is not one of"),
    ({"vocab_size": 50257}, "vocab_size=50257 but tokens are bytes"),
    ({"grad_accum_steps": 0}, "grad_accum_steps=0 must be at least 1"),
    ({"batch_size": "8"}, "batch_size='8' has the wrong type"),
    ({"compile": 1}, "compile=1 has the wrong type"),
])
def test_it_rejects_impossible_combinations_with_a_message_naming_them(raw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        TrainerConfig.from_dict(raw)


def test_presets_are_overridden_by_explicit_shape_fields():
    cfg = TrainerConfig.from_json('{"model": "small", "n_layer": 2, "lr": 1}')
    assert cfg.arch() == {"n_layer": 2, "n_head": 16, "n_embd": 1024, "block_size": 1024}
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)


def test_every_field_is_documented():
    from trainer.config import describe_fields

    assert all(help_text for _, help_text, _ in describe_fields())


def test_it_rejects_a_block_size_the_validation_split_cannot_fill():
    from trainer import data

    cfg = TrainerConfig.from_dict({"block_size": 200_000, "val_every_steps": 10,
                                   "batch_size": 1})
    with pytest.raises(ConfigError, match=r"block_size=200000 leaves the \d+-byte validation "
                                          r"split 1 windows, fewer than the 2 ranks need"):
        cfg.check_data(2, *data.split_sizes())
    # Without validation the same shape trains.
    TrainerConfig.from_dict({"block_size": 200_000, "batch_size": 1}).check_data(
        2, *data.split_sizes())


def test_it_rejects_a_corpus_too_small_for_the_ranks():
    from trainer import data

    cfg = TrainerConfig.from_dict({"model": "nano", "block_size": 4096, "batch_size": 8})
    cfg.check_data(64, *data.split_sizes())
    with pytest.raises(ConfigError, match="block_size=4096 with batch_size=8 needs 2048 windows "
                                          "of training text for 256 ranks"):
        cfg.check_data(256, *data.split_sizes())


def test_the_data_check_matches_what_the_sampler_and_validation_accept():
    import torch
    from trainer import data

    cfg = TrainerConfig.from_dict({"block_size": 10, "batch_size": 2, "val_every_steps": 1})
    train, val = torch.zeros(41, dtype=torch.uint8), torch.zeros(31, dtype=torch.uint8)
    cfg.check_data(2, len(train), len(val))  # 4 windows each: just enough
    data.ShardedSampler(train, 10, 2, rank=1, world_size=2, seed=0).next_batch()
    assert len(list(data.val_batches(val, 10, 2, rank=1, world_size=2, n_batches=1))) == 1
    with pytest.raises(ConfigError, match="needs 6 windows"):
        cfg.check_data(3, len(train), len(val))
    with pytest.raises(ValueError, match="corpus too small"):
        data.ShardedSampler(train, 10, 2, rank=2, world_size=3, seed=0)
    with pytest.raises(ConfigError, match="fewer than the 4 ranks"):
        TrainerConfig.from_dict({"block_size": 10, "batch_size": 1, "val_every_steps": 1}
                                ).check_data(4, len(train), 31)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # what the check spares ranks
        next(data.val_batches(torch.zeros(31, dtype=torch.uint8), 10, 1, rank=3,
                              world_size=4, n_batches=1))


def test_the_fault_knobs_live_under_faults_and_the_flat_keys_still_read_into_it():
    nested = TrainerConfig.from_dict({"faults": {"step_sleep_s": 0.1, "fail_at_step": 3}})
    flat = TrainerConfig.from_dict({"step_sleep_s": 0.1, "fail_at_step": 3})

    assert nested == flat and nested.faults.fail_at_step == 3
    assert "step_sleep_s" not in nested.to_dict()  # only under "faults"
    assert TrainerConfig.from_dict(nested.to_dict()) == nested  # a checkpoint's config reloads
    assert TrainerConfig().faults.step_sleep_s == 0 and TrainerConfig().faults.fail_at_step == 0


@pytest.mark.parametrize("raw, message", [
    ({"faults": {"sleep": 1}}, "unknown faults keys: sleep"),
    ({"faults": {"fail_at_step": -1}}, "must not be negative"),
    ({"faults": {"step_sleep_s": "1"}}, "faults.step_sleep_s='1' has the wrong type"),
    ({"faults": 3}, "faults must be a JSON object"),
])
def test_it_rejects_bad_fault_knobs_by_name(raw, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig.from_dict(raw)


def test_compile_defaults_to_the_device_and_the_fault_knobs_are_documented_apart():
    from trainer.config import describe_fields

    assert TrainerConfig().compile is None
    assert TrainerConfig.from_dict({"compile": None}).compile is None
    names = [name for name, _, _ in describe_fields()]
    assert names[-2:] == ["faults.step_sleep_s", "faults.fail_at_step"]
