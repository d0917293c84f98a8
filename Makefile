# The two commands: `make run` starts Regatta on embedded defaults,
# `make test` runs the whole suite. Both set up the virtualenv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The control plane itself needs no torch; the local fleet's ranks (the
# worker package, in the same virtualenv) do. Pinned: an open range would
# pull the newest CUDA build.
TORCH ?= 2.13.0

.PHONY: run test test-fast test-trainer install migrate demo lint bench clean \
	kube-build kube-build-if-go kube-up kube-down slurm-up slurm-down

$(STAMP): pyproject.toml worker_image/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "Installing Regatta, and the worker package with torch $(TORCH) for the local fleet's ranks"
	$(PY) -m pip install --quiet torch==$(TORCH) -e './worker_image[trainer,s3]' -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(PY) manage.py migrate --noinput

# DEMO_ARGS=--no-job starts the demo world without submitting the demo job.
DEMO_ARGS ?=

demo: migrate
	$(PY) manage.py regatta_demo $(DEMO_ARGS)

# For a terminal: Ctrl-C reaches the whole process group. A supervisor that
# signals one PID should run ./run instead: make does not pass SIGINT on.
run: demo
	$(PY) manage.py regatta_up

# The suite keeps its own state folder (SQLite test database, embedded
# redis-server and its socket), so it never shares one with a running
# `make run`. Set REGATTA_STATE_DIR to put it elsewhere (.ci/run does).
# The whole suite runs on TEST_WORKERS pytest-xdist workers (default 2), a
# test file to a worker and the real clusters' tests each on one (tests/
# support/xdist_workers.py); TEST_WORKERS=1 runs it in this process.
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
# runs meanwhile, and its real-cluster tests, which run last, wait for the
# build. Without Go they skip (CI=true makes them fail instead).
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

clean:
	rm -rf .regatta staticfiles test-artifacts
