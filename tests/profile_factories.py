"""A profiler trace as a rank leaves it: a gzipped Chrome trace in the job's
storage at the key the SDK writes (regatta.storage.profile_key), and its row
as the worker endpoint stores it."""

import gzip
import json

from regatta.storage import profile_key

from jobs.checkpointing import open_job_storage
from jobs.profiling.models import ProfileTrace

TRACE = {"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1,
     "ts": 0, "dur": 20},
]}


def write_trace(attempt, rank, *, request_id="feedc0de", start_step=7, steps=3,
                trace=None) -> ProfileTrace:
    key = profile_key(start_step, request_id, rank)
    data = gzip.compress(json.dumps(trace or TRACE).encode())
    open_job_storage(attempt.job).write_bytes(key, data)
    return ProfileTrace.objects.create(job=attempt.job, attempt=attempt, request_id=request_id,
                                       start_step=start_step, steps=steps, rank=rank, path=key,
                                       bytes=len(data))
