"""The job kinds the provider makes and follows to their end: PyTorchJob
(training-operator v1) and TrainJob (Trainer v2), as the preflight reads them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import manifests as mf
from . import trainjob as tj


@dataclass(frozen=True)
class JobKind:
    name: str
    resource: tuple[str, str, str]  # group, version, plural
    finished: Callable[[dict], bool]


def _pytorchjob_finished(job: dict) -> bool:
    return any(c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


PYTORCHJOB = JobKind("PyTorchJob", (mf.GROUP, mf.VERSION, mf.PLURAL), _pytorchjob_finished)
TRAINJOB = JobKind(tj.KIND, (tj.GROUP, tj.VERSION, tj.PLURAL), tj.finished)
