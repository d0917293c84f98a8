"""What of the worker's environment a local rank starts with
(clusters/providers/local/environment.py)."""

from clusters.providers.local.environment import rank_environment


def test_torch_compiles_settings_reach_the_ranks_and_secrets_do_not():
    """An operator who points torch.compile's kernel caches somewhere, or
    bounds its compile workers, does it for the ranks: the first step of a
    compiled model is where those settings count."""
    worker = {"TORCHINDUCTOR_CACHE_DIR": "/var/cache/inductor",
              "TORCHINDUCTOR_COMPILE_THREADS": "4", "TORCHDYNAMO_VERBOSE": "1",
              "TRITON_CACHE_DIR": "/var/cache/triton", "TORCH_LOGS": "recompiles",
              "SECRET_KEY": "not-for-ranks", "DATABASE_URL": "postgres://x@db/r"}

    env = rank_environment({"REGATTA_NODE": "n-0"}, worker)

    assert env == {"TORCHINDUCTOR_CACHE_DIR": "/var/cache/inductor",
                   "TORCHINDUCTOR_COMPILE_THREADS": "4", "TORCHDYNAMO_VERBOSE": "1",
                   "TRITON_CACHE_DIR": "/var/cache/triton", "TORCH_LOGS": "recompiles",
                   "REGATTA_NODE": "n-0"}
