"""Exit codes and the failure class each one stands for (docs/trainer-protocol.md).

Standard library only, so code running before torch is imported (config
rejection, an early SIGTERM) can name them. A user program exits 83
(`EXIT_PREEMPTED`) after its emergency checkpoint: `Run.exit_preempted`.
"""

EXIT_OK = 0
EXIT_CODE_ERROR = 1
EXIT_PREEMPTED = 83
EXIT_COLLECTIVE = 84
EXIT_CONFIG = 85

FAILURE_CLASS = {
    EXIT_OK: None,
    EXIT_CODE_ERROR: "code",
    EXIT_PREEMPTED: "preempted",
    EXIT_COLLECTIVE: "transient",
    EXIT_CONFIG: "code",
}
