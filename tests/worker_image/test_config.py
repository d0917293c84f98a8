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
