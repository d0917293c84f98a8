"""The worker contract, written once: what a rank finds in its environment
at launch, what its exit code says, and what it reports back.

Both sides are built from this module. The control plane sets the launch
environment by these names (jobs/reconcile/launch.py, and each provider in
clusters/providers/ for what only the node knows) and classifies exits by
these codes (jobs/recovery/detect.py); the SDK reads the same names
(regatta/launch.py) and exits with the same codes. What a rank reports is a table per
endpoint: the SDK builds its bodies from them (regatta/reporting.py) and
the server's checks are made from them (jobs/worker_api/).
docs/trainer-protocol.md tells people the same contract.

Standard library only: the control plane imports it without torch, and a
rank imports it before torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

# --- the launch environment: who sets each name, who reads it -----------------

TORCHRUN = "torchrun"
CONTROL_PLANE = "control plane"  # jobs/reconcile/launch.py, the same for every provider
PROVIDER = "provider"  # per node or pod, by the provider that starts it
LOCAL_PROVIDER = "local provider"
RANK_SDK = "SDK"  # regatta.launch.Launch, the built-in trainer's flags
TRAINER = "built-in trainer"
PROGRAM = "the job's program"
PREFLIGHT = "preflight check"  # python -m regatta.preflight
NODE_SIDE = "node side"  # the launcher, the standby, and the provider's scans of /proc


@dataclass(frozen=True)
class Var:
    """One name of a rank's environment: who sets it, who reads it, what it
    means, and the reader's value when it is unset."""

    name: str
    set_by: str
    read_by: str
    meaning: str
    default: str = ""


LAUNCH_ENV: dict[str, Var] = {}


def _var(name: str, set_by: str, read_by: str, meaning: str, default: str = "") -> str:
    LAUNCH_ENV[name] = Var(name, set_by, read_by, meaning, default)
    return name


RANK = _var("RANK", TORCHRUN, RANK_SDK, "this rank's number in the gang", "0")
WORLD_SIZE = _var("WORLD_SIZE", TORCHRUN, RANK_SDK, "the gang's number of ranks", "1")
LOCAL_RANK = _var("LOCAL_RANK", TORCHRUN, RANK_SDK, "this rank's number on its node", "0")
MASTER_ADDR = _var("MASTER_ADDR", TORCHRUN, RANK_SDK, "the rendezvous host", "127.0.0.1")
MASTER_PORT = _var("MASTER_PORT", TORCHRUN, RANK_SDK, "the rendezvous port")

URL = _var("REGATTA_URL", CONTROL_PLANE, RANK_SDK,
           "the control plane's base URL; unset: no reporting at all")
TOKEN = _var("REGATTA_TOKEN", CONTROL_PLANE, RANK_SDK,
             "this attempt's worker token, sent as `Authorization: Bearer`")
JOB_ID = _var("REGATTA_JOB_ID", CONTROL_PLANE, RANK_SDK,
              "the job's id: in every report body as `job_id`, and in status files")
ATTEMPT_ID = _var("REGATTA_ATTEMPT_ID", CONTROL_PLANE, RANK_SDK,
                  "the attempt's id: in every report's path", "0")
CHECKPOINT_URI = _var("REGATTA_CHECKPOINT_URI", CONTROL_PLANE, RANK_SDK,
                      "where step-N/ folders go: a path, file:///path or s3://bucket/prefix",
                      "checkpoints")
RESUME_STEP = _var("REGATTA_RESUME_STEP", CONTROL_PLANE, RANK_SDK,
                   "latest (the newest verified), none (start fresh), or N (the newest "
                   "verified at or before N)", "latest")
RESUME_URI = _var("REGATTA_RESUME_URI", CONTROL_PLANE, RANK_SDK,
                  "the exact step-N folder to resume from; wins over REGATTA_RESUME_STEP")
CHECKPOINT_EVERY = _var("REGATTA_CHECKPOINT_EVERY", CONTROL_PLANE, RANK_SDK,
                        "the job's every-N-steps policy (0: only when asked)", "0")
CONFIG = _var("REGATTA_CONFIG", CONTROL_PLANE, TRAINER,
              "the job's hyperparameters as a JSON object, with strategy, "
              "checkpoint_every_steps and keep_last")
EVAL_STEP = _var("REGATTA_EVAL_STEP", CONTROL_PLANE, PROGRAM,
                 "an eval run's step of its parent's checkpoint, to report its results at")
PARENT_JOB_ID = _var("REGATTA_PARENT_JOB_ID", CONTROL_PLANE, PROGRAM,
                     "an eval run's parent job, whose checkpoint it reads")

NODE = _var("REGATTA_NODE", PROVIDER, RANK_SDK,
            "the node's name, sent with heartbeats so a hang is pinned to a node; "
            "unset: the host's name")
STATUS_DIR = _var("REGATTA_STATUS_DIR", PROVIDER, RANK_SDK,
                  "the node's folder for each rank's exit record and start-up marker, "
                  "which the provider reads back; unset: none written")

LOCAL_FLEET = _var("REGATTA_LOCAL_FLEET", LOCAL_PROVIDER, NODE_SIDE,
                   "the local fleet's folder: tags every process of the fleet in /proc")
LOCAL_ATTEMPT_DIR = _var("REGATTA_LOCAL_ATTEMPT_DIR", LOCAL_PROVIDER, NODE_SIDE,
                         "the attempt's folder: tags every process of the attempt in /proc")
STANDBY_IMPORTS = _var("REGATTA_STANDBY_IMPORTS", LOCAL_PROVIDER, NODE_SIDE,
                       "a warm standby's further modules to import, comma-separated "
                       "(the local cluster's `standby_imports`)")

PREFLIGHT_OUT = _var("REGATTA_PREFLIGHT_OUT", PROVIDER, PREFLIGHT,
                     "the file each node's report goes to (default: the status folder's "
                     "preflight.json)")
PREFLIGHT_BYTES = _var("REGATTA_PREFLIGHT_BYTES", PROVIDER, PREFLIGHT,
                       "the all-reduce's tensor size in bytes", str(8 << 20))
PREFLIGHT_ITERS = _var("REGATTA_PREFLIGHT_ITERS", PROVIDER, PREFLIGHT,
                       "how many timed all-reduces", "5")
PREFLIGHT_TIMEOUT_S = _var("REGATTA_PREFLIGHT_TIMEOUT_S", PROVIDER, PREFLIGHT,
                           "how long a rank waits in the collective for a peer", "15.0")
PREFLIGHT_FAULT = _var("REGATTA_PREFLIGHT_FAULT", PROVIDER, PREFLIGHT,
                       "an operator's injected fault: the node reports it and leaves")

# REGATTA_RESUME_STEP's two words (anything else is a step number).
RESUME_LATEST = "latest"
RESUME_NONE = "none"


# --- exit codes ---------------------------------------------------------------

EXIT_OK = 0
EXIT_CODE_ERROR = 1  # an exception in the training program
EXIT_PREEMPTED = 83  # stopped (SIGTERM, a stop directive) after its emergency checkpoint
EXIT_COLLECTIVE = 84  # a collective or the rendezvous failed: a peer was lost
EXIT_CONFIG = 85  # the config was rejected before training started

# The failure class each code stands for, as the rank writes it in its exit
# record and as the control plane classifies the code.
CODE, PREEMPTED, TRANSIENT = "code", "preempted", "transient"
FAILURE_CLASS = {
    EXIT_OK: None,
    EXIT_CODE_ERROR: CODE,
    EXIT_PREEMPTED: PREEMPTED,
    EXIT_COLLECTIVE: TRANSIENT,
    EXIT_CONFIG: CODE,
}
CODE_EXITS = frozenset(code for code, cls in FAILURE_CLASS.items() if cls == CODE)


# --- what a rank leaves in REGATTA_STATUS_DIR ---------------------------------

def status_file(rank: int | str) -> str:
    """A rank's exit record, written just before it exits."""
    return f"rank-{rank}.json"


def startup_file(rank: int | str) -> str:
    """A rank's start-up marker, rewritten at each start-up phase."""
    return f"startup-{rank}.json"


STATUS_GLOB = status_file("*")


# --- what a rank reports: each endpoint's body --------------------------------

INT32 = 2**31 - 1
MAX_RANK = 65535
MAX_BYTES = 2**62
# The last second a datetime can hold (9999-12-31T23:59:59Z): a point's time.
# (timezone.utc, not datetime.UTC: the worker package runs on Python 3.10.)
MAX_TIME = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp()  # noqa: UP017
MAX_BATCH = 5000  # points in one metric batch (more is refused whole, 413)
MAX_METRIC_NAME = 64
MAX_PROFILE_STEPS = 50  # steps one profile may cover: a trace holds every op of each
EVENT_KIND = r"^[a-z][a-z0-9_]{0,40}$"  # snake_case, e.g. started


@dataclass(frozen=True)
class Field:
    """One field of a report body: its JSON type, bounds, and what the
    server takes when it is absent or null (`required` fields have none).
    For `str`, the lengths are in characters; for `list`, in items."""

    name: str
    type: type  # int, float (any finite JSON number), str, bool, dict, list
    meaning: str
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    min_length: int = 0
    max_length: int | None = None
    pattern: str | None = None
    default: Any = None


# Every body may name its job: when it does, it must be the attempt's.
JOB_ID_FIELD = Field("job_id", str, "this attempt's job's id (a string or an integer)")


@dataclass(frozen=True)
class Body:
    """A report body: the endpoint it is posted to
    (/api/v1/worker/attempts/<id>/<endpoint>) and its fields. Any other
    field is refused."""

    endpoint: str
    fields: tuple[Field, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def build(self, **values: Any) -> dict[str, Any]:
        """A body of these fields (a name outside the table is a bug in the
        caller, raised at once rather than refused by the server later)."""
        if not values.keys() <= self.names:
            raise ValueError(f"{self.endpoint}: no field {sorted(values.keys() - self.names)}")
        return values


def _int(name: str, meaning: str, *, maximum: float = INT32, required: bool = True,
         default: Any = None) -> Field:
    return Field(name, int, meaning, required=required, minimum=0, maximum=maximum,
                 default=default)


def _str(name: str, meaning: str, max_length: int, *, required: bool = False,
         pattern: str | None = None) -> Field:
    return Field(name, str, meaning, required=required, max_length=max_length,
                 pattern=pattern, default="")


def _rate(name: str, meaning: str) -> Field:
    return Field(name, float, meaning, minimum=0)


HEARTBEAT = Body("heartbeat", (
    _int("rank", "the rank beating", maximum=MAX_RANK),
    _str("node", "the node it runs on (REGATTA_NODE)", 253),
    _int("step", "the last step it completed"),
    _rate("samples_per_s", "samples a second over the last steps"),
    _rate("tokens_per_s", "tokens a second over the last steps"),
    _rate("step_time_s", "seconds a step took"),
    Field("gpu", dict, "the GPU's reading (memory, utilisation, temperature, power); null "
                       "without NVML"),
    JOB_ID_FIELD,
))
# The heartbeat's progress rates, stored with the rank and on the job.
PROGRESS = tuple(f.name for f in HEARTBEAT.fields if f.type is float)

METRIC_POINT = Body("metrics", (
    _int("rank", "the rank that measured it", maximum=MAX_RANK),
    Field("name", str, "the metric's name, e.g. loss", required=True, min_length=1,
          max_length=MAX_METRIC_NAME, default=""),
    _int("step", "the step it belongs to"),
    Field("value", float, "its value", required=True),
    Field("time", float, "when it was measured, in Unix seconds", minimum=0, maximum=MAX_TIME),
))

METRIC_BATCH = Body("metrics", (
    _str("batch_id", "the rank's name for this batch, for logs", 100),
    Field("points", list, "the points, each as METRIC_POINT has it", required=True,
          max_length=MAX_BATCH),
    JOB_ID_FIELD,
))

CHECKPOINT = Body("checkpoints", (
    _int("step", "the step whose commit marker rank 0 wrote"),
    Field("uri", str, "this job's own step-<step> folder, as its storage spells it",
          required=True, min_length=1, max_length=1000, default=""),
    _int("bytes", "the checkpoint's size", maximum=MAX_BYTES, required=False, default=0),
    _str("manifest_sha256", "the manifest's sha256", 64),
    Field("save_seconds", float, "seconds the save took", minimum=0, default=0.0),
    Field("blocking_seconds", float, "seconds of it that training waited", minimum=0,
          default=0.0),
    Field("emergency", bool, "taken on a stop (SIGTERM, a stop directive)", default=False),
    _str("request_id", "the checkpoint request it answers, if any", 64),
    JOB_ID_FIELD,
))

EVENT = Body("events", (
    _str("kind", "a snake_case event kind, e.g. started", 41, required=True,
         pattern=EVENT_KIND),
    _int("rank", "the rank it happened on", maximum=MAX_RANK, required=False, default=0),
    _str("message", "what happened, in words", 10_000),
    Field("data", dict, "its evidence", default={}),
    _str("node", "the node it happened on", 253),
    _str("key", "the rank's name for this event: stored once per key", 100),
    JOB_ID_FIELD,
))

PROFILE = Body("profiles", (
    _str("request_id", "a profile this attempt was asked for", 64, required=True),
    _int("rank", "a rank of the gang (below its world size)", maximum=MAX_RANK),
    _int("start_step", "the first step profiled"),
    _int("steps", "how many steps it covers", maximum=MAX_PROFILE_STEPS),
    Field("uri", str, "this job's own trace file, as its storage spells it", required=True,
          max_length=1000, default=""),
    _int("bytes", "the trace's size", maximum=MAX_BYTES, required=False, default=0),
    JOB_ID_FIELD,
))

REPORTS = (HEARTBEAT, METRIC_BATCH, CHECKPOINT, EVENT, PROFILE)
