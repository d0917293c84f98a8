"""What a job's spec may not change about its ranks' isolation, unless an
operator lets it on that cluster.

A job's own `env` reaches every rank, and on the local and Slurm fleets the
launcher and torchrun too, and on Kubernetes the container runtime. So a
name passes only if it is one teams need for their program's own libraries
(`TEAM_ENV`, the table in docs/byo.md, "The environment a job may set"), or
the cluster's `env_allow` setting names it (or a prefix of it, `NCCL_*`).
Everything else is refused with a 400 naming it: names that choose GPUs or
how they are numbered (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER,
NVIDIA_*, HIP_*), load code into every process or change where code comes
from (LD_*, PYTHONPATH, PATH, GCONV_PATH, GLIBC_TUNABLES), rewrite
torchrun's own arguments (PET_*), pick the network fabric (NCCL_* beyond
its debug output) or a proxy, take on cloud or cluster identities (AWS_*,
KUBERNETES_*), and any name the table does not know. The launch's own
names (RANK, MASTER_ADDR, REGATTA_*, ...) are refused whatever the cluster
says (jobs/validators.py). The cluster's `image_allow` setting, when set,
lists the registries or repository prefixes jobs may run images from.
"""

from __future__ import annotations

from controlplane.lib.typed_settings import SettingsError

# (name, or prefix ending in *; what teams set it for). Each touches only
# the program's own process: its libraries' caches, logging, threads,
# compiler and allocator, never devices, the loader, the launch or the network.
TEAM_ENV: tuple[tuple[str, str], ...] = (
    ("HF_*", "Hugging Face Hub and libraries: HF_HOME, HF_TOKEN, HF_HUB_OFFLINE"),
    ("HUGGINGFACE_*", "the same, older names"),
    ("TRANSFORMERS_*", "Transformers: TRANSFORMERS_OFFLINE, TRANSFORMERS_VERBOSITY"),
    ("DATASETS_*", "Datasets: DATASETS_OFFLINE"),
    ("TOKENIZERS_PARALLELISM", "tokenizers' own threads"),
    ("ACCELERATE_*", "Accelerate's options"),
    ("WANDB_*", "Weights & Biases: WANDB_MODE, WANDB_PROJECT, WANDB_API_KEY"),
    ("MLFLOW_*", "MLflow"),
    ("COMET_*", "Comet"),
    ("NEPTUNE_*", "Neptune"),
    ("TORCH_*", "PyTorch: TORCH_LOGS, TORCH_HOME, TORCH_DISTRIBUTED_DEBUG, TORCH_NCCL_*"),
    ("PYTORCH_*", "PyTorch's allocator and CUDA options: PYTORCH_CUDA_ALLOC_CONF"),
    ("TORCHINDUCTOR_*", "torch.compile's code generator: TORCHINDUCTOR_CACHE_DIR"),
    ("TORCHDYNAMO_*", "torch.compile's tracer"),
    ("TRITON_*", "Triton: TRITON_CACHE_DIR"),
    ("OMP_*", "OpenMP threads: OMP_NUM_THREADS"),
    ("MKL_NUM_THREADS", "MKL threads"),
    ("OPENBLAS_NUM_THREADS", "OpenBLAS threads"),
    ("CUDA_LAUNCH_BLOCKING", "synchronous CUDA, to debug"),
    ("CUDA_MODULE_LOADING", "lazy or eager CUDA module loading"),
    ("CUBLAS_WORKSPACE_CONFIG", "deterministic cuBLAS"),
    ("NCCL_DEBUG", "NCCL's log level (the fabric's NCCL_* are the operator's)"),
    ("NCCL_DEBUG_SUBSYS", "what NCCL logs"),
    ("PYTHONUNBUFFERED", "unbuffered output"),
    ("PYTHONHASHSEED", "a fixed hash seed"),
    ("PYTHONFAULTHANDLER", "tracebacks on a crash"),
    ("PYTHONDONTWRITEBYTECODE", "no .pyc files"),
    ("PYTHONIOENCODING", "the encoding of standard streams"),
    ("PYTHONUTF8", "UTF-8 mode"),
    ("LANG", "the locale"),
    ("LC_ALL", "the locale"),
    ("TZ", "the time zone"),
)
TEAM_ENV_ALLOW = tuple(entry for entry, _ in TEAM_ENV)


def team_may_set(name: str) -> bool:
    return _allowed(name, TEAM_ENV_ALLOW)


def _allowed(name: str, allow: tuple[str, ...]) -> bool:
    return any(name == entry or (entry.endswith("*") and name.startswith(entry[:-1]))
               for entry in allow)


def image_allowed(image: str, allow: tuple[str, ...]) -> bool:
    """Whether `image` comes from one of `allow`: a registry
    (`registry.example.com`, matched up to the `/` after it, so
    registry.example.com.evil.io/x is not), a folder of repositories
    (`ghcr.io/team/`, matched as a prefix), or a repository
    (`ghcr.io/team/trainer`, with any tag or digest)."""
    for entry in allow:
        if entry.endswith("/"):  # a folder of repositories
            ok = image.startswith(entry)
        elif "/" not in entry:  # a registry
            ok = image.startswith(entry + "/")
        else:  # a repository
            ok = image == entry or image.startswith((entry + ":", entry + "@"))
        if ok:
            return True
    return False


def check_spec(attrs) -> dict[str, list[str]]:
    """Field messages for a job spec's env and image on its cluster."""
    cluster = attrs.get("cluster")
    if cluster is None:
        return {}
    try:
        config = cluster.config
    except SettingsError as exc:  # saved before its settings were checked
        return {"cluster": [str(exc)]}
    errors: dict[str, list[str]] = {}
    refused = sorted(name for name in attrs.get("env") or {}
                     if not team_may_set(name) and not _allowed(name, config.env_allow))
    if refused:
        errors["env"] = [
            f"{name}: not one a job may set (its libraries' knobs: docs/byo.md, \"The "
            f"environment a job may set\"); a name that chooses GPUs, loaded code, torchrun's "
            f"arguments, the network or credentials is the operator's, who can allow it on "
            f"cluster {cluster.name} with its env_allow setting." for name in refused]
    image = attrs.get("image")
    if image and config.image_allow is not None and not image_allowed(image,
                                                                      config.image_allow):
        errors["image"] = [f"{image} is not from a registry cluster {cluster.name} allows: "
                           f"{', '.join(config.image_allow) or 'none'}."]
    return errors
