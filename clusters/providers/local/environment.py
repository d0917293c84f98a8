"""The environment a rank of the local fleet starts with.

Ranks run the job's entrypoint, which is user code, so they never inherit the
worker's whole environment: that holds the control plane's own secrets
(DATABASE_URL, SECRET_KEY, REDIS_URL, cloud credentials). They get what
Python, torch and the collective libraries read, and the variables the
provider hands them (the trainer's REGATTA_* contract). The worker's own
REGATTA_* settings stay behind too.

This is a first fence, not isolation: local ranks run as the worker's user
on the worker's machine. Production isolation is the Kubernetes provider's
pods, which get only the trainer's variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PASSED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "PYTHONFAULTHANDLER", "PYTHONWARNINGS", "LD_LIBRARY_PATH", "HF_HOME",
    # Which certificate authorities to trust (paths, no secrets).
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE",
    # Where S3 is and in which region; credentials are not passed.
    "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
})
PASSED_PREFIXES = ("LC_", "NCCL_", "GLOO_", "FI_", "CUDA_", "CUDNN_", "CUBLAS_", "NVIDIA_",
                   "TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_",
                   # torch.compile's: its kernel caches, compile workers, logs.
                   "TORCHINDUCTOR_", "TORCHDYNAMO_", "TRITON_")


def rank_environment(given: Mapping[str, object],
                     source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlisted part of `source` (the worker's environment), then `given`."""
    source = os.environ if source is None else source
    env = {k: v for k, v in source.items() if k in PASSED or k.startswith(PASSED_PREFIXES)}
    env.update({k: str(v) for k, v in given.items()})
    return env
