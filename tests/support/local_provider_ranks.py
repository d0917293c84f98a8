"""A tiny torch.distributed program the local provider's tests launch instead of
the trainer: it joins the gang, all-reduces a few times, writes the status file
the trainer would, and exits with the code asked for (REGATTA_TEST_EXIT) or
keeps stepping for REGATTA_TEST_STEPS steps of REGATTA_TEST_STEP_S seconds.
With REGATTA_TEST_DUMP_ENV set, each rank first writes the environment it was
given to `env-<rank>.json`, its import path to `path-<rank>.json` and the
modules imported when it started to `modules-<rank>.json`, for the tests of
what user code may see; with
REGATTA_TEST_CUDA, `cuda-<rank>.json`: the GPUs CUDA would see, and whether
it finds one (the trainer's first CUDA call)."""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    rank = int(os.environ["RANK"])
    steps = int(os.environ.get("REGATTA_TEST_STEPS", "3"))
    step_s = float(os.environ.get("REGATTA_TEST_STEP_S", "0.05"))
    code = int(os.environ.get("REGATTA_TEST_EXIT", "0"))
    if os.environ.get("REGATTA_TEST_DUMP_ENV"):
        with open(os.path.join(os.environ["REGATTA_STATUS_DIR"], f"env-{rank}.json"), "w") as fh:
            json.dump(dict(os.environ), fh)
        with open(os.path.join(os.environ["REGATTA_STATUS_DIR"], f"path-{rank}.json"), "w") as fh:
            json.dump(sys.path, fh)
        with open(os.path.join(os.environ["REGATTA_STATUS_DIR"], f"modules-{rank}.json"),
                  "w") as fh:
            json.dump(sorted(sys.modules), fh)
    if os.environ.get("REGATTA_TEST_CUDA"):
        # What CUDA would see here: the driver reads CUDA_VISIBLE_DEVICES from
        # the C environment when it initialises, not from os.environ.
        import ctypes

        seen = ctypes.CDLL(None).getenv
        seen.restype = ctypes.c_char_p
        with open(os.path.join(os.environ["REGATTA_STATUS_DIR"], f"cuda-{rank}.json"), "w") as fh:
            json.dump({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                       "visible_to_cuda": (seen(b"CUDA_VISIBLE_DEVICES") or b"").decode(),
                       "available": torch.cuda.is_available()}, fh)
    stop = {"asked": False}
    if os.environ.get("REGATTA_TEST_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a rank stuck where it cannot exit
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    tensor = torch.ones(4)
    step = 0
    progress = os.path.join(os.environ["REGATTA_STATUS_DIR"], f"progress-{rank}")
    for step in range(1, steps + 1):
        dist.all_reduce(tensor)
        with open(progress, "w") as fh:
            fh.write(str(step))
        if stop["asked"]:
            code = 83  # the trainer's "stopped on SIGTERM" code
            break
        time.sleep(step_s)  # a step's length, not a wait
    status = {"rank": rank, "exit_code": code, "failure_class": None, "error": None,
              "step": step, "time": time.time(), "sum": tensor[0].item()}
    with open(os.path.join(os.environ["REGATTA_STATUS_DIR"], f"rank-{rank}.json"), "w") as fh:
        json.dump(status, fh)
    if code == 0:
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # As the SDK exits (regatta.run._exit): a gloo rank that leaves without
    # destroying its process group can abort in interpreter teardown (c10d
    # destructors), and a drained rank's 83 would read as SIGABRT.
    os._exit(exit_code)
