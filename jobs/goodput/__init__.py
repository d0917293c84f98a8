"""The goodput ledger: the logic is in `jobs/goodput/ledger.py`; the package's
names are its door."""

from .ledger import (  # noqa: F401
    Category,
    book,
    book_attempt_end,
    book_queueing_many,
    book_restart,
    book_running,
    queueing_entry,
    revise_rollback,
    summarize,
)
