"""GPU telemetry through NVML (optional) and the peak FLOP/s table for MFU."""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("regatta.gpu")

# Dense bf16 peak FLOP/s (no sparsity), from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    "H100 SXM": 989e12,
    "H100 80GB HBM3": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
}


def peak_flops(device: torch.device) -> float | None:
    """Peak bf16 FLOP/s of the device, or None when it is not in the table."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def nvml_sampler(device: torch.device):
    """A callable returning the heartbeat's `gpu` dict, or None without NVML."""
    if device.type != "cuda":
        return lambda: None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    except Exception as exc:  # NVML missing or broken: report no GPU stats
        log.info("NVML unavailable (%s); heartbeats carry gpu=null", exc)
        return lambda: None

    def sample() -> dict[str, Any] | None:
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            return {
                "memory_used_mb": int(mem.used // (1 << 20)),
                "utilization_pct": int(util.gpu),
                "temperature_c": int(
                    pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
                ),
                "power_w": round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1),
            }
        except Exception:
            return None

    return sample
