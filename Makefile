# gpumeter: the README's two commands are `make demo` and `make test`.
# Both do their own set-up on a fresh Debian machine: Debian tools, a virtual env, the package.
# `make check` is the fast loop: lint, type check and every test that needs no server or binary from
# outside the virtual env (tests/support/needs.py says which do), over the editable install. No sudo,
# no apt, no database. `make check PYTHON=python3.12 VENV=.venv-3.12` runs it on another Python.
# `make test` runs the suite over the wheel as users get it: built, installed non-editable into a fresh
# virtual environment of Debian's Python (the image's), and run from a folder outside the checkout.

SHELL := /bin/bash
# Bytecode is cached, outside the tree, for every command make runs. A machine that exports
# PYTHONDONTWRITEBYTECODE (CI's does) otherwise has each pytest worker and each of the ~60 `python -m
# gpumeter` children the tests start compile every module from source: 12 s of `make check`.
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CURDIR)/build/pycache
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the tests and the demo drive for real (binary:package).
DEBIAN_TOOLS := prometheus:prometheus promtool:prometheus \
	prometheus-alertmanager:prometheus-alertmanager amtool:prometheus-alertmanager \
	psql:postgresql-client pg_ctlcluster:postgresql chromium:chromium kubectl:kubectl wrk:wrk \
	victoria-metrics:victoria-metrics buildah:buildah debootstrap:debootstrap
STAMP := $(VENV)/.installed
# kubernetes-validate, checkov and hadolint in their own env, so their pins cannot move the project's
TOOLS_VENV := .venv-tools
TOOLS_STAMP := $(TOOLS_VENV)/.installed

# The wheel's own environment: Debian's Python, whose files every user can read (the image-layout test
# runs commands as UID 10001; pyenv's interpreters live under /root), fresh for every `make test`.
WHEEL_PYTHON ?= /usr/bin/python3
WHEEL_DIR := build/wheel
WHEEL_VENV := build/wheel-venv
PYENV_ROOT ?= $(HOME)/.pyenv
# pytest over an installed gpumeter, from an empty folder: the checkout is only where tests/ is read.
# $(1): the virtual environment.
installed_pytest = cd "$$(mktemp -d)" && GPUMETER_HYPOTHESIS=ci $(CURDIR)/$(1)/bin/pytest -c $(CURDIR)/pyproject.toml --rootdir $(CURDIR) $(CURDIR)/tests

.PHONY: all setup warm tools tools-venv venv postgres test check fast-tests lint typecheck demo bench proto docs dashboards image clean wheel wheel-venv fast-tests-on installed-fast-tests

all: test

tools:
	@missing=""; for pair in $(DEBIAN_TOOLS); do bin=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$bin >/dev/null 2>&1 || [ -x /usr/sbin/$$bin ] || [ -x /usr/bin/$$bin ] || missing="$$missing $$pkg"; done; \
	  if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	    $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$(echo $$missing | tr ' ' '\n' | sort -u) >/dev/null; fi
	@for py in $(PYTHON) $(WHEEL_PYTHON); do $$py -c 'import venv, ensurepip' 2>/dev/null || \
	  { [ -x $(WHEEL_PYTHON) ] || $(SUDO) apt-get update -qq; DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv >/dev/null; break; }; done

$(STAMP): pyproject.toml
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(STAMP)

# The wheel, built from the working tree with the dev venv's pinned setuptools. setuptools packs whatever
# build/lib holds, so a file pyproject no longer ships (the kustomize tree) stayed in every in-place
# build until build/lib was removed (tests/support/wheel.py builds from a copy instead).
wheel: venv
	rm -rf $(WHEEL_DIR) build/lib && $(BIN)/pip wheel -q --no-deps --no-build-isolation -w $(WHEEL_DIR) .

wheel-venv: wheel
	rm -rf $(WHEEL_VENV) && $(WHEEL_PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install -q --upgrade pip
	$(WHEEL_VENV)/bin/pip install -q "$$(ls $(WHEEL_DIR)/gpumeter-*.whl)[dev]"

# `make fast-tests-on PY=3.13`: the wheel in a fresh venv of pyenv's Python $(PY), and the tests that need
# no server; run for 3.12 and 3.13 before a change lands (.ci/run says why CI does not).
fast-tests-on: wheel
	@py=$$(ls -d $(PYENV_ROOT)/versions/$(PY).* 2>/dev/null | sort -V | tail -1)/bin/python$(PY); \
	  [ -x "$$py" ] || { echo "fast-tests-on: no Python $(PY) under $(PYENV_ROOT) (pyenv install $(PY))"; exit 1; }; \
	  rm -rf build/venv-$(PY) && $$py -m venv build/venv-$(PY) && build/venv-$(PY)/bin/pip install -q --upgrade pip && \
	  build/venv-$(PY)/bin/pip install -q "$$(ls $(WHEEL_DIR)/gpumeter-*.whl)[dev]"
	$(call installed_pytest,build/venv-$(PY)) -q -m "not external" -n 4

$(TOOLS_STAMP): tests/deploy/tools-requirements.txt tests/deploy/tools-venv.sh
	PYTHON=$(PYTHON) TOOLS_VENV=$(TOOLS_VENV) bash tests/deploy/tools-venv.sh

tools-venv: $(TOOLS_STAMP)

# focus-validator on Python 3.12 in .venv-focus/ (tests/reports/test_focus.py; idempotent)
focus-venv: tests/reports/focus-validator-requirements.txt tests/reports/focus-validator-venv.sh
	bash tests/reports/focus-validator-venv.sh

# The ledger tests run against a real PostgreSQL on 127.0.0.1:5432; start the local cluster if it is down.
postgres:
	@pg_isready -q -h 127.0.0.1 -p 5432 || { cluster=$$(ls /etc/postgresql | sort -V | tail -1); \
	  echo "starting PostgreSQL $$cluster"; $(SUDO) pg_ctlcluster --skip-systemctl-redirect $$cluster main start; \
	  for i in $$(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; }
	@# A fresh Debian cluster asks for passwords on TCP; the test cluster trusts loopback, as the dev machines do.
	@psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1" >/dev/null 2>&1 || { \
	  hba=$$(ls /etc/postgresql/*/main/pg_hba.conf | sort -V | tail -1); echo "trusting loopback in $$hba"; \
	  $(SUDO) sed -i '1i host all all 127.0.0.1/32 trust' $$hba; \
	  $(SUDO) pg_ctlcluster --skip-systemctl-redirect $$(basename $$(dirname $$(dirname $$hba))) main reload; }
	@psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 || \
	  psql -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE test" >/dev/null

setup: tools venv warm tools-venv focus-venv postgres

# The caches the fast loop reads, filled once by setup so that the first `make check` after a clone runs
# as the next ones do (cold, it took 108 s against 86 s): the tree's bytecode (pip compiles what it
# installs, but an editable install's modules are the tree's), pytest's rewritten test modules, mypy's
# cache. Neither a failing collection nor a type error fails setup: `make check` reports them.
warm: venv
	$(BIN)/python -m compileall -q -j0 exporter billing reports dashboards alerts deploy gpumeter tests >/dev/null
	-@GPUMETER_HYPOTHESIS=loop $(BIN)/pytest -q --collect-only -m "not external" -p no:cacheprovider >/dev/null
	-@$(MAKE) --no-print-directory typecheck >/dev/null

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check exporter billing reports dashboards alerts deploy tests gpumeter || \
	  { echo "run: $(BIN)/ruff format ."; exit 1; }

# mypy over the package laid out as installed (pyproject's [tool.mypy] says what is strict).
typecheck: venv
	$(BIN)/python -m tests.support.typecheck

# The fast loop: lint, mypy and the tests side by side. The tests spread over 4 pytest-xdist workers
# even on 2 cores, since the listener tests partly wait on sockets and deadlines (80 s against 82 s on
# three workers), and mypy fills the cores while they wait. The loop is CPU-bound: a test that repeats
# work another already does (a ledger filled per worker, a child process for an argument error) costs
# it directly (docs/performance.md, "make check under 90 s"). No test bounds wall-clock time
# (a busy machine would decide its verdict), so none needs the machine to itself: deadlines are
# injected and shown by order, and timings are measured by `make bench`. The target prints its own
# wall time and the slowest tests.
check: venv
	@status=0; SECONDS=0; \
	  $(MAKE) --no-print-directory -j3 lint typecheck fast-tests || status=$$?; \
	  echo "make check: $$SECONDS s wall time (exit $$status)"; exit $$status

fast-tests: venv
	GPUMETER_HYPOTHESIS=loop $(BIN)/pytest -q -m "not external" -n 4 --durations=25

# Everything, against the real servers and tools, over the installed wheel; a missing one fails its
# tests, never skips them. The image (mostly downloads: debootstrap's packages, then pip's) builds in
# the background from the start, beside the set-up and the first run, and only the second run needs it.
# The set-up's parts (virtual envs, mostly downloads too) install side by side. Then two runs, both of
# which always run (either failing fails the target): the tests that need no server beside lint and
# mypy, as in `make check` (they mostly wait on sockets and deadlines), then those against real
# servers on three workers, a module at a time, the longest modules first (tests/support/schedule.py
# says why: 527 s on 2026-12-05 against 1,696 s with worksteal, which started every shared stack once
# per worker). The target prints the machine's cores and load, its speed once the set-up is done (the
# benches' own loop, tests/bench_billing.py), each phase's wall time and the slowest tests against
# servers: CI's budget is 30 minutes, and its machines' speed varies (2.4x on 2026-12-06).
TEST_SETUP := venv tools-venv focus-venv postgres wheel-venv
test: tools
	@status=0; SECONDS=0; mkdir -p build; \
	  echo "make test: $$(nproc) cores, load average $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	  $(PYTHON) -m tests.deploy.image build >build/image-build.log 2>&1 & image=$$!; \
	  $(MAKE) --no-print-directory -j4 --output-sync=target $(TEST_SETUP) || \
	    { kill $$image 2>/dev/null; echo "make test: the set-up failed"; exit 1; }; \
	  echo "make test: set-up done at $$SECONDS s; the benches' 10M-step Python loop (CPU time):" \
	    "$$($(BIN)/python -c 'from tests.bench_billing import python_loop_seconds as s; print(f"{s():.2f}")') s"; \
	  $(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck installed-fast-tests || status=$$?; \
	  echo "make test: lint, mypy and the tests that need no server done at $$SECONDS s"; \
	  if wait $$image; then echo "make test: image $$(tail -1 build/image-build.log) built by $$SECONDS s"; \
	  else status=1; echo "make test: the image failed to build (build/image-build.log):"; tail -40 build/image-build.log; fi; \
	  ( $(call installed_pytest,$(WHEEL_VENV)) -q -m external -n 3 --dist loadscope --no-loadscope-reorder \
	    --durations=15 ) || status=$$?; \
	  echo "make test: $$SECONDS s wall time (exit $$status)"; exit $$status

installed-fast-tests:
	$(call installed_pytest,$(WHEEL_VENV)) -q -m "not external" -n 4

# The Dockerfile built for real by buildah on a debootstrap base of Debian's Python (registry images
# cannot be pulled here), as localhost/gpumeter:VERSION in build/image/'s own storage
# (tests/deploy/image.py). Cold 5 to 8 min on a busy 2-core machine (debootstrap 1.2-3.5 min, then
# pip's downloads), 40 s after a source change, 12 s unchanged; IMAGE_STORAGE_DRIVER=vfs where overlay
# cannot mount (vfs: 58 s unchanged, each container a full copy).
image: tools
	$(PYTHON) -m tests.deploy.image build

demo: tools venv
	$(BIN)/gpumeter demo

# The targets (docs/architecture.md, "Targets") are measured here, not in timed unit tests; figures go to
# docs/performance.md.
# Every bench runs whatever the one before found (a missed target exits 1, and the target then does
# too): billing on each store and ledger, at 1,000 and 10,000 GPUs, a 100,000-GPU day on
# VictoriaMetrics (its history is 38 GB as text, so it goes straight into the store), then the reports.
BENCH_PG = postgresql+psycopg://postgres@127.0.0.1:5432/test
BENCHES = "tests.bench" \
	"tests.bench_billing --reprice" \
	"tests.bench_billing --db $(BENCH_PG) --store victoriametrics" \
	"tests.bench_billing --store victoriametrics" \
	"tests.bench_ledger_floor" \
	"tests.bench_billing --scale 10 --days 3 --db $(BENCH_PG)" \
	"tests.bench_billing --scale 10 --days 3 --db $(BENCH_PG) --store victoriametrics" \
	"tests.bench_billing --scale 100 --days 1 --db $(BENCH_PG) --store victoriametrics" \
	"tests.bench_reports" \
	"tests.bench_reports --gpus 10000"
bench: setup
	@status=0; for bench in $(BENCHES); do \
	  echo "== python -m $$bench"; $(BIN)/python -m $$bench || status=$$?; \
	done; exit $$status

proto: venv
	$(BIN)/python -m gpumeter.exporter.kubelet.generate

docs: venv
	$(BIN)/gpumeter docs metrics > docs/metrics.md

dashboards: venv
	$(BIN)/gpumeter dashboards build --out dashboards/generated --configmaps deploy/kubernetes/base/dashboards

clean:
	rm -rf $(VENV) $(TOOLS_VENV) .pytest_cache .ruff_cache .hypothesis var .bench
