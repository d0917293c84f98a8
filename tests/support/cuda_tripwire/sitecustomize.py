"""A tripwire on CUDA's entry points, for the tests of what may touch CUDA
before a fork (tests/clusters/providers/local/test_standby_cuda.py). Put this folder
first on PYTHONPATH: every interpreter started with it (and every process
forked from one) appends one line per call to `calls.jsonl` beside this
file: which process (its pid, and its RANK: None outside a rank), which
entry point, and the innermost frames of the caller.

What it watches: what initialises the CUDA driver (cuInit), after which a
forked child cannot use CUDA: torch._C's `_cuda_getDeviceCount` (under
`torch.cuda.is_available()`, and `device_count()` where NVML cannot count)
and `_cuda_init` (torch.cuda's lazy init, under every device call), and
the driver library loaded through ctypes. NVML (libnvidia-ml, pynvml)
forks safely and is not recorded. It changes nothing else: each call goes
on to the real function.
"""

import importlib.abc
import json
import os
import sys
import traceback

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl")
WATCHED = ("_cuda_getDeviceCount", "_cuda_init")


def _record(what: str) -> None:
    stack = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_stack()[-8:-2]]
    line = json.dumps({"pid": os.getpid(), "rank": os.environ.get("RANK"), "what": what,
                       "stack": stack})
    with open(LOG, "a") as fh:
        fh.write(line + "\n")


def _wrap(module, name: str) -> None:
    real = getattr(module, name, None)
    if real is None or getattr(real, "_tripwire", False):
        return

    def watched(*args, **kwargs):
        _record(f"{module.__name__}.{name}")
        return real(*args, **kwargs)

    watched._tripwire = True
    setattr(module, name, watched)


class _AfterTorchCuda(importlib.abc.MetaPathFinder):
    """Wraps torch._C's CUDA entry points the moment torch.cuda is executed,
    before any module can call them."""

    def find_spec(self, name, path, target=None):
        if name != "torch.cuda":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            import torch

            for watched in WATCHED:
                _wrap(torch._C, watched)
            execute(module)

        spec.loader.exec_module = exec_module
        return spec


def _audit(event, args):
    if event != "ctypes.dlopen" or not args or not args[0]:
        return
    name = os.path.basename(str(args[0]))
    if name.startswith("libcuda.so"):
        _record(f"dlopen {name}")


sys.meta_path.insert(0, _AfterTorchCuda())
sys.addaudithook(_audit)
