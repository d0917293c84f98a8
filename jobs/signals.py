"""Signals the job reconciler sends at moments worth observing.

`launch_point` marks the two moments where a worker that dies mid-launch
leaves the most to recover (`point`): "launch", the attempt's row written
and nothing started, and "launched", the provider started the ranks and the
row does not say so yet. The next pass must adopt those ranks, not launch a
second gang; tests connect here to kill a real worker at either moment
(tests/e2e/test_worker_crash_e2e.py).
"""

from django.dispatch import Signal

launch_point = Signal()  # kwargs: point ("launch" | "launched"), job_id
