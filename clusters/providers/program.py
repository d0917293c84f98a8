"""What follows torchrun's own options on every launch: the program.

torchrun reads its options up to the program's path and hands the rest to
the program, and with several values for one option it takes the last. A
program whose argv began with `--nproc_per_node=8` or `--rdzv_endpoint=…`
would set torchrun's own flags (processes, rendezvous, restarts), so every
launcher (local, Slurm, Kubernetes) ends torchrun's options with `--` before
the program: whatever the program's argv holds is the program's. Job specs
whose entrypoint begins with `-` are refused as well (jobs/validators.py).

A command is the program's argv as the control plane builds it (a job's
entrypoint and args), or, for the control plane's own programs (the
built-in trainer, the preflight), `("-m", module, *args)`: a Python module,
run with torchrun's `--module`.
"""

from __future__ import annotations

BUILTIN_TRAINER = ("-m", "trainer")


def torchrun_program(command: tuple[str, ...] | list[str]) -> list[str]:
    """torchrun's arguments from the end of its options on: `--module` for
    a module, then `--`, then the program and its arguments, verbatim.
    Empty: the built-in trainer."""
    command = tuple(command) or BUILTIN_TRAINER
    if command[0] == "-m" and len(command) > 1:
        return ["--module", "--", *command[1:]]
    return ["--", *command]
