"""Entry point of one rank: `torchrun ... -m trainer` or `regatta-train`.

Exit codes (docs/trainer-protocol.md, regatta/contract.py): 0 finished, 1 error
in training code, 83 preempted (SIGTERM or a stop directive: after an emergency
checkpoint, or at once when it came before training started), 84
collective/rendezvous failure, 85 config rejected.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

# Nothing here imports torch at module level: `run` must install the SIGTERM
# handling (regatta/preemption.py) before torch starts its first thread.
from regatta import contract as c
from regatta import preemption
from regatta.contract import EXIT_CODE_ERROR, EXIT_COLLECTIVE, EXIT_CONFIG
from regatta.launch import Launch
from regatta.reporting import report_once
from regatta.status import write_status

from trainer.config import ConfigError, TrainerConfig

log = logging.getLogger("trainer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="regatta-train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-json", default=env.get(c.CONFIG, ""),
                   help=f"trainer config as a JSON object (default: ${c.CONFIG})")
    p.add_argument("--config-file", help="read the config JSON from this file instead")
    p.add_argument("--checkpoint-uri", default=env.get(c.CHECKPOINT_URI, "checkpoints"),
                   help="path, file:///path or s3://bucket/prefix (default: ./checkpoints)")
    p.add_argument("--resume-step", default=env.get(c.RESUME_STEP, c.RESUME_LATEST),
                   help="latest (default), none, or a step number")
    p.add_argument("--resume-uri", default=env.get(c.RESUME_URI, ""),
                   help="the step-N folder to resume from (wins over --resume-step)")
    p.add_argument("--status-dir", default=env.get(c.STATUS_DIR),
                   help="write rank-<RANK>.json here on exit")
    p.add_argument("--url", default=env.get(c.URL), help="control plane base URL")
    p.add_argument("--token", default=env.get(c.TOKEN), help="per-attempt worker token")
    p.add_argument("--job-id", default=env.get(c.JOB_ID, ""),
                   help="the control plane's job id, sent with every report")
    p.add_argument("--attempt-id", default=env.get(c.ATTEMPT_ID, "0"))
    p.add_argument("--node", default=env.get(c.NODE, os.uname().nodename))
    p.add_argument("--staging-dir", default=os.path.join(tempfile.gettempdir(),
                                                         "regatta-staging"),
                   help="local folder for S3 uploads/downloads")
    return p.parse_args(argv)


def launch_from(args: argparse.Namespace) -> Launch:
    """The launch contract with the command line's overrides applied."""
    return Launch.from_env({
        **os.environ, c.URL: args.url or "", c.TOKEN: args.token or "",
        c.JOB_ID: str(args.job_id), c.ATTEMPT_ID: str(args.attempt_id),
        c.NODE: args.node, c.CHECKPOINT_URI: args.checkpoint_uri,
        c.RESUME_STEP: str(args.resume_step or c.RESUME_LATEST),
        c.RESUME_URI: args.resume_uri or "", c.STATUS_DIR: args.status_dir or "",
    })


def setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def load_config(args: argparse.Namespace, world_size: int) -> TrainerConfig:
    """The config, checked against the corpus for this many ranks: a shape
    the data cannot feed is a config error (85) here, not a crash after
    rendezvous."""
    from trainer import data

    text = Path(args.config_file).read_text() if args.config_file else args.config_json
    cfg = TrainerConfig.from_json(text or "{}")
    cfg.check_data(world_size, *data.split_sizes())
    return cfg


def run(argv: list[str] | None = None) -> int:
    """Run one rank to completion and return its exit code (never raises,
    except that an early SIGTERM ends the process)."""
    args = parse_args(argv)
    launch = launch_from(args)
    setup_logging(launch.rank)
    # Before anything imports torch, which starts a thread of its own.
    guard = preemption.install(launch=launch)
    guard.enter("config")
    try:
        cfg = load_config(args, launch.world_size)
    except (ConfigError, OSError) as exc:
        log.error("config rejected: %s", exc)
        report_once(launch.env(), launch.rank, "crashed", f"config rejected: {exc}", {
            "error_type": type(exc).__name__, "traceback": str(exc), "failure_class": "code"})
        write_status(launch, EXIT_CONFIG, str(exc), 0)
        return EXIT_CONFIG
    return train(cfg, args, launch)


def train(cfg: TrainerConfig, args: argparse.Namespace, launch: Launch) -> int:
    import regatta
    import torch.distributed as dist
    from regatta.dist import classify

    from trainer.trainer import Trainer

    sdk_run, trainer = None, None
    code, error = EXIT_CODE_ERROR, None
    try:
        log.info("joining the process group as rank %d of %d", launch.rank, launch.world_size)
        try:
            sdk_run = regatta.init(
                config=cfg.to_dict(), checkpoint_every=cfg.checkpoint_every_steps,
                keep_last=cfg.keep_last, async_checkpoint=cfg.async_checkpoint,
                heartbeat_interval_s=cfg.heartbeat_interval_s,
                startup_timeout_s=cfg.startup_timeout_s, launch=launch,
                staging_dir=args.staging_dir)
        except Exception as exc:
            raise _RendezvousError(str(exc)) from exc
        trainer = Trainer(cfg, sdk_run)
        trainer.setup()
        sdk_run.phase("resume")
        trainer.resume()
        code = trainer.evaluate_checkpoint() if cfg.mode == "eval" else trainer.run()
    except BaseException as exc:  # every failure becomes an exit code and a report
        code = EXIT_COLLECTIVE if isinstance(exc, _RendezvousError) else classify(exc)
        error = f"{type(exc).__name__}: {exc}"
        if sdk_run is not None:
            sdk_run.crashed(exc, code)
        else:
            log.exception("crashed before the run started (exit %d)", code)
            report_once(launch.env(), launch.rank, "crashed", error[:500], {
                "error_type": type(exc).__name__, "traceback": error, "failure_class":
                "transient" if code == EXIT_COLLECTIVE else "code"})
    step = trainer.step if trainer is not None else 0
    if sdk_run is not None:
        sdk_run.close(code, error, step)
    else:
        write_status(launch, code, error, step)
    # After a failed collective the group may be wedged; tearing it down could hang.
    if dist.is_initialized() and code != EXIT_COLLECTIVE:
        try:
            dist.destroy_process_group()
        except Exception:
            log.exception("destroy_process_group failed")
    return code


class _RendezvousError(RuntimeError):
    pass


def main(argv: list[str] | None = None) -> None:
    code = run(argv)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit right after destroy_process_group: on CPU, torchrun's ranks can
    # otherwise abort in interpreter teardown (gloo/c10d destructors).
    os._exit(code)


if __name__ == "__main__":
    main()
