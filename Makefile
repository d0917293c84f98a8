# The two commands: `make run` starts Regatta on embedded defaults,
# `make test` runs the whole suite. Both set up the virtualenv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Packages are installed by uv (pinned here, from PyPI), kept once per
# machine beside its cache: it fetches in parallel and links installs from
# that cache, so a second virtualenv on the machine takes seconds, torch
# included. Its own virtualenv needs only Python's venv module.
UV_VERSION ?= 0.13.9
UV_HOME ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/regatta/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
UV_INSTALL := $(UV) pip install --python $(PY) --quiet
# Everything: the control plane, the fleet's torch and the test tools.
STAMP := $(VENV)/.installed-stamp
# The control plane alone (web, worker, beat need no torch), and the local
# fleet's worker environment (torch and the trainer, for its ranks): `./run`
# starts the first and installs the second behind it.
CONTROLPLANE_STAMP := $(VENV)/.controlplane-stamp
FLEET_STAMP := $(VENV)/.fleet-stamp
# Pinned: an open range would pull the newest CUDA build.
TORCH ?= 2.13.0
# A virtualenv (with pip: the tests build wheels with it) and uv to fill it.
ENSURE_VENV = [ -x $(UV) ] || { $(PYTHON) -m venv $(UV_HOME) && \
	$(UV_HOME)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION); }; \
	[ -x $(PY) ] || $(UV) venv --quiet --seed --python $(PYTHON) $(VENV)
# Whether the virtualenv has everything, current with the project's files.
HAS_ALL = [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ] && \
	[ $(STAMP) -nt worker_image/pyproject.toml ]

.PHONY: run test test-fast test-trainer install controlplane fleet-env migrate demo \
	lint bench clean kube-build kube-build-if-go kube-up kube-down slurm-up slurm-down

$(CONTROLPLANE_STAMP): pyproject.toml worker_image/pyproject.toml
	@if $(HAS_ALL); then :; else $(ENSURE_VENV); \
		echo "Installing the control plane (no torch)"; \
		$(UV_INSTALL) -e ./worker_image -e .; fi
	@touch $@

# Not --quiet: regatta_up reads uv's download bars for the progress it shows.
# Bytecode compiled here, behind the web: uv leaves it to the first import
# otherwise, and torch's thousands of modules would be compiled by the first
# standbys and ranks, each on its own, as the first job starts.
$(FLEET_STAMP): $(CONTROLPLANE_STAMP)
	@if $(HAS_ALL); then :; else \
		echo "Installing the local fleet's worker environment: torch $(TORCH) and the trainer"; \
		$(UV) pip install --python $(PY) --compile-bytecode torch==$(TORCH) \
			-e './worker_image[trainer,s3]'; fi
	@touch $@

$(STAMP): pyproject.toml worker_image/pyproject.toml
	@$(ENSURE_VENV)
	@echo "Installing Regatta, the worker package with torch $(TORCH) for the local fleet's ranks, and the test tools"
	$(UV_INSTALL) --compile-bytecode --upgrade-package pip pip torch==$(TORCH) \
		-e './worker_image[trainer,s3]' -e '.[test]'
	@touch $(STAMP) $(CONTROLPLANE_STAMP) $(FLEET_STAMP)

install: $(STAMP)
controlplane: $(CONTROLPLANE_STAMP)
fleet-env: $(FLEET_STAMP)

migrate: controlplane
	@$(PY) manage.py migrate --noinput -v0

# DEMO_ARGS=--no-job starts the demo world without submitting the demo job.
DEMO_ARGS ?=

demo: migrate
	@$(PY) manage.py regatta_demo $(DEMO_ARGS)

# For a terminal: Ctrl-C reaches the whole process group. A supervisor that
# signals one PID should run ./run instead: make does not pass SIGINT on.
# The web starts once the control plane is installed; the fleet's torch
# installs behind it (`make fleet-env`, run by regatta_up --install-fleet),
# and the demo job waits for it with that reason.
run: demo
	$(PY) manage.py regatta_up --install-fleet

# The suite keeps its own state folder (SQLite test database, embedded
# redis-server and its socket), so it never shares one with a running
# `make run`. Set REGATTA_STATE_DIR to put it elsewhere (.ci/run does).
# The whole suite runs on TEST_WORKERS pytest-xdist workers (default 2), a
# test file to a worker, the real clusters' tests together on one, the
# costliest files first (tests/support/xdist_workers.py); TEST_WORKERS=1
# runs it in this process.
TEST_WORKERS ?= 2
test: export REGATTA_STATE_DIR ?= $(CURDIR)/.regatta/test
test: install kube-build-if-go
	$(PY) -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) \
	  --durations=25 $(PYTEST_ARGS)

# The inner loop: the tests not marked slow (no torchrun ranks, browser,
# end-to-end fleet, fuzzing or other processes started), on one pytest-xdist
# worker per core, each with its own state folder, Redis and test database
# (tests/support/xdist_workers.py); the whole suite is `make test`.
FAST_WORKERS ?= auto
test-fast: export REGATTA_STATE_DIR ?= $(CURDIR)/.regatta/test
test-fast: install
	$(PY) -m pytest -m "not slow" -n $(FAST_WORKERS) --dist loadfile --durations=10 $(PYTEST_ARGS)

# The worker SDK and the trainer (tests/worker_image, real torchrun ranks)
# against another torch the worker package admits (torch>=2.9), in a
# virtualenv of its own, e.g. the GPU image's release:
#   make VENV=.venv-torch-2.11.0 TORCH=2.11.0 test-trainer
# Any torch but the pinned one comes from PyPI as a CUDA build, a download
# of several GB; `make test` runs the same tests on the pinned one.
test-trainer: export REGATTA_STATE_DIR ?= $(CURDIR)/.regatta/test-trainer
test-trainer: install
	$(PY) -m pytest -n $(FAST_WORKERS) --dist loadfile --durations=10 tests/worker_image $(PYTEST_ARGS)

# The real Kubernetes test cluster (testcluster/, docs/kubernetes.md): its
# binaries are built from Go modules into ~/.cache/regatta-kube/<versions>/
# (a cold build takes tens of minutes; later ones find them there).
# kube-up starts it on loopback ports with a kwok GPU fleet and prints the
# kubeconfigs; kube-down stops it.
KUBE_STATE ?= $(CURDIR)/.regatta/kube

kube-build: install
	$(PY) -m testcluster build

# Where Go is installed and the binaries are missing, `make test` starts
# their build in the background (log beside them in the cache): the suite
# runs meanwhile, and its real-Kubernetes tests, handed out last then, wait
# for the build. Without Go they skip (CI=true makes them fail instead).
kube-build-if-go: install
	@if command -v go >/dev/null || [ -x /usr/local/go/bin/go ]; then \
		$(PY) -m testcluster build --background; \
	else echo "kube: no Go here; the real-cluster tests will skip"; fi

kube-up: install
	$(PY) -m testcluster up --state $(KUBE_STATE)

kube-down:
	$(PY) -m testcluster down --state $(KUBE_STATE)

# A real Slurm on this machine (slurmcluster/, docs/slurm.md) from Debian's
# packages: munged, MariaDB and slurmdbd (sacct), slurmctld and six slurmds
# on loopback ports, as root.
SLURM_STATE ?= $(CURDIR)/.regatta/slurm

slurm-up: install
	$(PY) -m slurmcluster up --state $(SLURM_STATE)

slurm-down:
	$(PY) -m slurmcluster down --state $(SLURM_STATE)

# ruff, then the arrows (pyproject.toml's [tool.importlinter] contracts).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) tools/imports_first.py

clean:
	rm -rf .regatta staticfiles test-artifacts
