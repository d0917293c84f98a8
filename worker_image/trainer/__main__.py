"""Entry point of one rank: `torchrun ... -m trainer` or `regatta-train`.

Exit codes (docs/trainer-protocol.md): 0 finished, 1 error in training code,
83 stopped after an emergency checkpoint, 84 collective/rendezvous failure,
85 config rejected.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from trainer.config import ConfigError, TrainerConfig
from trainer.distributed import (
    EXIT_CODE_ERROR,
    EXIT_COLLECTIVE,
    EXIT_CONFIG,
    FAILURE_CLASS,
    classify,
    env_rank,
)

log = logging.getLogger("trainer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="regatta-train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-json", default=env.get("REGATTA_CONFIG", ""),
                   help="trainer config as a JSON object (default: $REGATTA_CONFIG)")
    p.add_argument("--config-file", help="read the config JSON from this file instead")
    p.add_argument("--checkpoint-uri", default=env.get("REGATTA_CHECKPOINT_URI", "checkpoints"),
                   help="path, file:///path or s3://bucket/prefix (default: ./checkpoints)")
    p.add_argument("--resume-step", default=env.get("REGATTA_RESUME_STEP", "latest"),
                   help="latest (default), none, or a step number")
    p.add_argument("--status-dir", default=env.get("REGATTA_STATUS_DIR"),
                   help="write rank-<RANK>.json here on exit")
    p.add_argument("--url", default=env.get("REGATTA_URL"), help="control plane base URL")
    p.add_argument("--token", default=env.get("REGATTA_TOKEN"), help="per-attempt worker token")
    p.add_argument("--attempt-id", default=env.get("REGATTA_ATTEMPT_ID", "0"))
    p.add_argument("--node", default=env.get("REGATTA_NODE", os.uname().nodename))
    p.add_argument("--staging-dir", default=os.path.join(tempfile.gettempdir(),
                                                         "regatta-staging"),
                   help="local folder for S3 uploads/downloads")
    return p.parse_args(argv)


def setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def load_config(args: argparse.Namespace) -> TrainerConfig:
    text = Path(args.config_file).read_text() if args.config_file else args.config_json
    return TrainerConfig.from_json(text or "{}")


def write_status(status_dir: str | None, rank: int, code: int, error: str | None,
                 step: int) -> None:
    if not status_dir:
        return
    try:
        Path(status_dir).mkdir(parents=True, exist_ok=True)
        path = Path(status_dir) / f"rank-{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "rank": rank, "exit_code": code, "failure_class": FAILURE_CLASS.get(code),
            "error": error, "step": step, "time": time.time(),
        }))
        os.replace(tmp, path)
    except OSError:
        log.exception("could not write the status file in %s", status_dir)


def _summary(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines)
    return text if len(text) < 4000 else text[:1000] + "\n...\n" + text[-3000:]


def run(argv: list[str] | None = None) -> int:
    """Run one rank to completion and return its exit code (never raises)."""
    from trainer import reporting

    rank = env_rank()
    setup_logging(rank)
    args = parse_args(argv)
    env = {**os.environ, "REGATTA_URL": args.url or "", "REGATTA_TOKEN": args.token or "",
           "REGATTA_ATTEMPT_ID": str(args.attempt_id), "REGATTA_NODE": args.node}
    trainer = None
    try:
        cfg = load_config(args)
    except (ConfigError, OSError) as exc:
        log.error("config rejected: %s", exc)
        reporter = reporting.from_env(env, rank, 1.0)
        reporter.event("crashed", f"config rejected: {exc}", {
            "error_type": type(exc).__name__, "traceback": str(exc), "failure_class": "code"})
        reporter.start()
        reporter.close(timeout_s=3.0)
        write_status(args.status_dir, rank, EXIT_CONFIG, str(exc), 0)
        return EXIT_CONFIG

    import torch.distributed as dist

    from trainer import distributed, gpu
    from trainer.trainer import RunOptions, Trainer

    reporter = reporting.NullReporter()
    code, error = EXIT_CODE_ERROR, None
    try:
        try:
            d = distributed.init(cfg.startup_timeout_s)
        except Exception as exc:
            raise _RendezvousError(str(exc)) from exc
        reporter = reporting.from_env(env, d.rank, cfg.heartbeat_interval_s,
                                      gpu.nvml_sampler(d.device))
        reporter.start()
        trainer = Trainer(cfg, RunOptions(args.checkpoint_uri, args.resume_step,
                                          args.staging_dir), d, reporter)
        trainer.setup()
        trainer.resume()
        code = trainer.run()
    except BaseException as exc:  # every failure becomes an exit code and a report
        code = EXIT_COLLECTIVE if isinstance(exc, _RendezvousError) else classify(exc)
        error = f"{type(exc).__name__}: {exc}"
        summary = _summary(exc)
        log.error("crashed (exit %d, %s):\n%s", code, FAILURE_CLASS[code], summary)
        reporter.event("crashed", error[:500], {
            "error_type": type(exc).__name__, "traceback": summary,
            "failure_class": FAILURE_CLASS[code]})
    step = trainer.step if trainer is not None else 0
    write_status(args.status_dir, rank, code, error, step)
    reporter.close(timeout_s=5.0)
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
