"""A rank program that stalls its start-up on purpose: rank
REGATTA_TEST_STALL_RANK (default 1) never gets past its imports (it sleeps
before the SDK is imported, as a rank whose imports hang would), so it never
reports; every other rank enters the SDK (`regatta.init()`) and waits in the
rendezvous for it. The start-up report tests read what each is doing."""

import os
import time

from regatta import preemption

preemption.install()
if os.environ.get("RANK") == os.environ.get("REGATTA_TEST_STALL_RANK", "1"):
    while True:
        time.sleep(1.0)  # stalled on purpose: this is the rank that never comes

import regatta  # noqa: E402 - after the stall, as a program's imports would come

regatta.init(startup_timeout_s=600)
