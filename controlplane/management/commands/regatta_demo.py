"""Create the demo world, idempotently: an admin, a team with a quota, a local
cluster with a spare, and (unless --no-job) a 2-node job (1-node on a pool of
one) training the built-in model. Its pool is `cpu` (gloo on CPU, on any machine), or with
`--devices cuda` `gpu`: one of this machine's GPUs per node (docs/fleet.md)."""

import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.models import ApiToken, hash_token
from clusters.models import Cluster, NodePool
from jobs.models import Quota, Team, TrainingJob
from jobs.services import submit_job

DEMO_USER = "admin"
DEMO_PASSWORD = "regatta-demo"
# The demo token, kept (owner-only) so that regatta_up can print it again:
# the database keeps only its hash.
TOKEN_FILE = "demo-token"

DEMO_JOB_HYPERPARAMETERS = {
    "model": "tiny",
    "max_steps": 3000,
    "batch_size": 8,
    "val_every_steps": 50,
    "log_every_steps": 5,
}


class Command(BaseCommand):
    help = "Create the demo admin, team, quota, local cluster and a demo job."

    def add_arguments(self, parser):
        parser.add_argument("--no-job", action="store_true", help="do not submit the demo job")
        parser.add_argument("--nodes", type=int, default=4, help="working nodes in the pool")
        parser.add_argument("--spares", type=int, default=1, help="spare nodes in the pool")
        parser.add_argument("--devices", choices=("cpu", "cuda"), default="cpu",
                            help="cpu: pool `cpu`, gloo on CPU; cuda: pool `gpu`, one of this "
                                 "machine's GPUs per node, NCCL")

    @transaction.atomic
    def handle(self, *args, no_job=False, nodes=4, spares=1, devices="cpu", **options):
        User = get_user_model()
        admin, created = User.objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            admin.set_password(DEMO_PASSWORD)
            admin.save()
        cluster, _ = Cluster.objects.get_or_create(
            name="local", defaults={"provider": Cluster.Provider.LOCAL,
                                    "description": "torchrun on this machine (logical nodes)",
                                    "settings": {"heartbeat_deadline_s": 30}},
        )
        name = "gpu" if devices == "cuda" else "cpu"
        pool, _ = NodePool.objects.get_or_create(
            cluster=cluster, name=name,
            defaults={"instance_type": f"local-{name}", "gpus_per_node": 1, "size": nodes,
                      "spare_count": spares, "settings": {"devices": devices}},
        )
        team, _ = Team.objects.get_or_create(name="demo", defaults={"display_name": "Demo team"})
        team.members.add(admin)
        Quota.objects.get_or_create(team=team, cluster=cluster,
                                    defaults={"gpus": 4, "max_running_jobs": 2})
        token = None
        if not ApiToken.objects.active().filter(user=admin, name="demo").exists():
            _, token = ApiToken.issue(admin, "demo")
        job = None
        if not no_job and not TrainingJob.objects.filter(team=team).exclude(
            phase__in=TrainingJob.TERMINAL
        ).exists():
            # The API's own submit path (storage, the Submitted event); no
            # task is sent, as the broker starts after this, and beat's first
            # sweep reconciles the job.
            job = submit_job({
                "name": "demo-gpt-tiny", "team": team, "cluster": cluster,
                # Two nodes, or one where the pool has one (a one-GPU machine).
                "pool": pool, "num_nodes": min(2, pool.size), "gpus_per_node": 1,
                "hyperparameters": DEMO_JOB_HYPERPARAMETERS, "checkpoint_every_steps": 100,
            }, admin, send=False)
        if token:
            _keep_token(Path(settings.STATE_DIR) / TOKEN_FILE, token)
        self.stdout.write(f"demo login: {DEMO_USER} / {DEMO_PASSWORD}")
        if token:
            self.stdout.write(f"demo API token: {token}")
        if job:
            self.stdout.write(f"demo job #{job.pk} submitted ({job.num_nodes} node(s), "
                              "built-in GPT)")


def _keep_token(path: Path, token: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    os.replace(tmp, path)


@dataclass(frozen=True)
class SignIn:
    user: str = ""
    password: str = ""
    token: str = ""
    token_file: str = ""


def demo_sign_in(state_dir: Path) -> SignIn:
    """How to sign in to the demo, as far as it still holds: the password
    only while the demo admin has it, the token only while it is active."""
    user = get_user_model().objects.filter(username=DEMO_USER).first()
    if user is None:
        return SignIn()
    password = DEMO_PASSWORD if user.check_password(DEMO_PASSWORD) else ""
    path = state_dir / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except OSError:
        token = ""
    if token and not ApiToken.objects.active().filter(
            user=user, token_hash=hash_token(token)).exists():
        token = ""
    return SignIn(user=DEMO_USER, password=password, token=token,
                  token_file=str(path) if token else "")
