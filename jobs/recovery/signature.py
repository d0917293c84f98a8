"""The user's own error, found in a failed node's log, and the signature of
a failure: what makes two failures the same one.

A failed rank's log holds the program's traceback and, after it, torchrun's
report of how its ranks ended (its `ChildFailedError` summary, with the
root cause's rank and exit code). Peers that failed because of it add their
own tracebacks ("Connection closed by peer"). The line a person needs is the
root cause rank's exception, wherever it sits in the log: never a fixed-size
tail, which on a chatty program holds only torchrun's summary.

Pure functions over text: the providers hand in what they read of each log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# torchrun prefixes each line a rank writes with its global rank.
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank(\d+)\]:\s?")
# torchrun's own log lines: "E1128 17:17:12.680000 18142 torch/...] ..."
_TORCHRUN_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):(.*?)(?:={10,}|\Z)", re.S)
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)
_TRACEBACK = "Traceback (most recent call last):"
# What a rank says when a peer died under it: collateral, not the cause.
_COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|ChildFailedError|"
    r"DistNetworkError|ProcessGroupNCCL.*(?:watchdog|timeout)|NCCL error|"
    r"RendezvousClosedError|broken pipe|SignalException|Signal \d+ \(SIG\w+\) received",
    re.IGNORECASE)
# Lines that say nothing about the program.
_NOISE = re.compile(r"^\*+$|^-+$|^=+$|OMP_NUM_THREADS|^\s*$")
MAX_LINES = 20


@dataclass(frozen=True)
class RootCause:
    """torchrun's root cause of a node's failure: the rank and how it ended
    (exit code; negative: killed by that signal)."""

    rank: int | None
    exit_code: int | None


@dataclass(frozen=True)
class UserError:
    """The program's own error: its last line (`line`, e.g. "ValueError:
    bad learning rate") and the lines around it (a traceback), from rank
    `rank` where the log says which."""

    line: str
    lines: tuple[str, ...] = field(default=())
    rank: int | None = None

    def as_evidence(self) -> dict:
        return {"line": self.line, "lines": list(self.lines), "rank": self.rank}


def is_collateral(line: str) -> bool:
    """Whether an error line is what a rank says when a peer died under it."""
    return bool(_COLLATERAL.search(line or ""))


def root_cause(log: str) -> RootCause | None:
    found = _ROOT_CAUSE.search(log or "")
    if found is None:
        return None
    block = found.group(1)
    rank = _ROOT_RANK.search(block)
    code = _ROOT_EXIT.search(block)
    return RootCause(int(rank.group(1)) if rank else None,
                     int(code.group(1)) if code else None)


def _split(log: str) -> list[tuple[int | None, str]]:
    """(rank or None, line) for each line, the rank prefix taken off."""
    out = []
    for raw in (log or "").splitlines():
        match = _RANK_PREFIX.match(raw)
        if match:
            out.append((int(match.group(1)), raw[match.end():]))
        else:
            out.append((None, raw))
    return out


def _tracebacks(lines: list[tuple[int | None, str]]) -> list[UserError]:
    """Each traceback in the log, per rank, with its exception line."""
    found = []
    open_blocks: dict[int | None, list[str]] = {}
    for rank, text in lines:
        block = open_blocks.get(rank)
        if text.startswith(_TRACEBACK):
            open_blocks[rank] = [text]
            continue
        if block is None:
            continue
        block.append(text)
        # Frames are indented; the first line that is not ends the block,
        # unless it is a chained exception's joining sentence.
        if text and not text.startswith((" ", "\t")) and not text.startswith(
                ("During handling", "The above exception")):
            found.append(UserError(line=text.strip(), lines=tuple(block[-MAX_LINES:]),
                                   rank=rank))
            del open_blocks[rank]
    return found


def user_error(log: str) -> UserError | None:
    """The program's error in `log`, or None when the log shows none."""
    if not log:
        return None
    cause = root_cause(log)
    lines = _split(log)
    blocks = [b for b in _tracebacks(lines) if "ChildFailedError" not in b.line]
    if blocks:
        own = [b for b in blocks if not _COLLATERAL.search(b.line)] or blocks
        if cause is not None and cause.rank is not None:
            of_root = [b for b in own if b.rank == cause.rank]
            own = of_root or own
        return own[-1]
    return _last_words(lines, cause)


def _last_words(lines: list[tuple[int | None, str]], cause: RootCause | None) -> UserError | None:
    """No traceback (a program that printed its error and exited 1): its last
    lines before torchrun's report, the root cause rank's where known."""
    kept = []
    for rank, text in lines:
        if text.startswith(("Traceback", "torch.distributed.elastic")) or "FAILED" in text:
            break  # torchrun's own report begins
        if _TORCHRUN_LOG.match(text) or _NOISE.search(text):
            continue
        if cause is not None and cause.rank is not None and rank not in (None, cause.rank):
            continue
        kept.append((rank, text.rstrip()))
    if not kept:
        return None
    tail = kept[-MAX_LINES:]
    return UserError(line=tail[-1][1].strip(), lines=tuple(t for _, t in tail),
                     rank=tail[-1][0])


_VARYING = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\]?:?\d*"), "<addr>"),
    (re.compile(r"\bpid[ :=]*\d+", re.IGNORECASE), "pid …"),
    (re.compile(r"\d{4,}"), "…"),
]


def normalize(line: str) -> str:
    """The line with what differs between two runs of the same failure
    (addresses, ports, pids, long numbers) blanked out."""
    text = line.strip()
    for pattern, stand_in in _VARYING:
        text = pattern.sub(stand_in, text)
    return text[:300]


def signature(kind: str, exit_code: int | None, error: UserError | None) -> str:
    """What makes two failures the same, wherever they happened: what kind
    (a process that ended, ranks that went silent), how the process ended,
    and the program's error line (normalised)."""
    how = "?" if exit_code is None else (f"signal {-exit_code}" if exit_code < 0
                                          else f"exit {exit_code}")
    return f"{kind} | {how} | {normalize(error.line) if error else ''}"
