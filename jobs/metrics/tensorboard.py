"""A job's metrics as one TensorBoard event file, produced as a stream.

The file is TensorBoard's own format: TFRecord framing (length, masked
CRC32C of the length, the data, masked CRC32C of the data) around `Event`
protobufs, the first naming the file version, then one scalar `Summary` per
point with the point's step and wall time. tensorboardX supplies the
protobuf classes and the record checksum (native CRC32C through the `crc32c`
package); its SummaryWriter is not used, because it writes to a file from a
background thread and the API streams the bytes as they are made instead.
tensorboardX is imported by the export alone: its package imports torch
wherever torch is installed (its SummaryWriter takes tensors), which cost
every web, worker and manage.py process of a machine with the local fleet
2 to 4 CPU-seconds and some 300 MB, for an export few requests ask for.

Every raw point goes in, not the charts' downsampled series, one metric
after the other, each in step order: the points that speak for the job
(rank 0's where it reported the metric, and the newest attempt where a
rollback replayed steps, jobs/metrics/series.py), read in chunks through the
(job, name, step) index. Memory stays flat however long the job.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from jobs.metrics.models import MetricName
from jobs.metrics.series import effective_points_of, plan
from jobs.models import TrainingJob

if TYPE_CHECKING:
    from tensorboardX.proto.event_pb2 import Event

FILE_VERSION = "brain.Event:2"
_CHUNK_ROWS = 20_000
# Bytes gathered before a piece of the stream is handed on.
_PIECE = 1 << 16


def record(event: Event) -> bytes:
    from tensorboardX.record_writer import masked_crc32c

    data = event.SerializeToString()
    header = struct.pack("<Q", len(data))
    return b"".join((header, struct.pack("<I", masked_crc32c(header)), data,
                     struct.pack("<I", masked_crc32c(data))))


def file_name(job: TrainingJob, now: float | None = None) -> str:
    """TensorBoard finds event files by the `tfevents` in their name."""
    return f"events.out.tfevents.{int(now or time.time())}.regatta-job-{job.pk}"


def _points(job_id: int, name: str) -> Iterator[tuple[int, float, float]]:
    """(step, value, wall time) of the metric's speaking points, one a step."""
    chart = plan(job_id, name)
    if chart is None:
        return
    rows = (effective_points_of(chart).order_by("step", "rank")
            .values_list("step", "value", "time").iterator(chunk_size=_CHUNK_ROWS))
    last = None
    for step, value, when in rows:
        if step != last:  # several ranks speak for a metric rank 0 did not report
            last = step
            yield step, value, when.timestamp()


def events(job: TrainingJob, now: float | None = None) -> Iterator[bytes]:
    """The event file's bytes, in pieces of about 64 KiB."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary

    piece = [record(Event(wall_time=now or time.time(), step=0, file_version=FILE_VERSION))]
    size = len(piece[0])
    names = MetricName.objects.filter(job=job).order_by("name").values_list("name", flat=True)
    for name in list(names):
        for step, value, wall in _points(job.pk, name):
            one = record(Event(wall_time=wall, step=step, summary=Summary(
                value=[Summary.Value(tag=name, simple_value=value)])))
            piece.append(one)
            size += len(one)
            if size >= _PIECE:
                yield b"".join(piece)
                piece, size = [], 0
    if piece:
        yield b"".join(piece)
