"""What a job's spec may not change about its ranks' isolation, unless an
operator lets it on that cluster.

A job's own `env` reaches every rank. Some names there would let a team
step outside what Regatta gave it: see GPUs it was not given
(NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES), load code into every
process of the image (LD_PRELOAD and the loader's other LD_* variables),
rewrite torchrun's own arguments (PET_*: torchrun reads PET_NNODES,
PET_RDZV_ENDPOINT, ... as its flags), or take on cloud or cluster
identities (AWS_* credentials and role variables, KUBERNETES_*). They are
refused with a 400 naming the variable, unless the cluster's `env_allow`
setting names it (or a prefix of it, `AWS_*`). The cluster's `image_allow`
setting, when set, lists the registries or repository prefixes jobs may
run images from.
"""

from __future__ import annotations

from controlplane.lib.typed_settings import SettingsError

ISOLATION_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"})
ISOLATION_ENV_PREFIXES = ("LD_", "PET_", "AWS_", "KUBERNETES_")


def changes_isolation(name: str) -> bool:
    return name in ISOLATION_ENV or name.startswith(ISOLATION_ENV_PREFIXES)


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
                     if changes_isolation(name) and not _allowed(name, config.env_allow))
    if refused:
        errors["env"] = [
            f"{name}: changes what the ranks may see or run as (GPUs, loaded code, "
            f"torchrun's arguments, cloud or cluster credentials); an operator can allow it "
            f"on cluster {cluster.name} with its env_allow setting." for name in refused]
    image = attrs.get("image")
    if image and config.image_allow is not None and not image_allowed(image,
                                                                      config.image_allow):
        errors["image"] = [f"{image} is not from a registry cluster {cluster.name} allows: "
                           f"{', '.join(config.image_allow) or 'none'}."]
    return errors
