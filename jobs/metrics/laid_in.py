"""Points another feature lays into a job's series: an eval run's results
at the checkpoint step it evaluated (jobs/evals/). The feature that has
them provides them here at start (jobs/apps.py), so the metrics never
import it: jobs/evals imports the metrics' models to read what its runs
reported, and the arrow must point one way."""

from __future__ import annotations

from collections.abc import Callable


class LaidIn:
    """Where a job's laid-in points and their metric names come from; none
    until a feature provides them."""

    def __init__(self, what: str):
        self.what = what
        self._points: Callable[[int, str], list[tuple[int, float]]] = lambda job_id, name: []
        self._names: Callable[[int], set[str]] = lambda job_id: set()

    def provide(self, points, names) -> None:
        self._points, self._names = points, names

    def points(self, job_id: int, name: str) -> list[tuple[int, float]]:
        """(step, value) of metric `name` laid into job `job_id`'s series."""
        return self._points(job_id, name)

    def names(self, job_id: int) -> set[str]:
        return self._names(job_id)


EVAL_RESULTS = LaidIn("eval runs' results")
