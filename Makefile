# One entry point for people and CI. `make demo` sets everything up and shows GPUs reaching pods;
# `make test` runs every check CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NODES ?= 2
PYTEST_ARGS ?=
IMAGE ?= dra-driver:dev

.PHONY: all venv prereqs prereqs-demo pins-check prefetch pin proto proto-check lint unit unit-no-helm unit-helm e2e e2e-oldest e2e-next e2e-kind image test bench bench-scale binaries runtime real-node-up real-node-down cluster-up cluster-down demo demo-down deploy-checks clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Stops at once, naming the Debian packages to install, instead of failing deep in a build.
prereqs:
	$(PYTHON) -m e2e.tooling.prereqs test

prereqs-demo:
	$(PYTHON) -m e2e.tooling.prereqs demo

# Every Go tool builds from a committed go.mod + go.sum with -mod=readonly: this fails in seconds
# (warm) when a build would have to resolve anything go.sum does not name.
pins-check:
	$(PYTHON) -m e2e.tooling.gotools check

# make test's Go builds, started ahead in one background worker at the lowest CPU priority, so that
# they use the core the stages before them leave idle; it stops when make does (e2e/tooling/prefetch.py).
prefetch: $(STAMP)
	$(PY) -m e2e.tooling.prefetch start --watch $$PPID

# Re-pin a Go tool and print what changed, e.g. `make pin TOOL=kubernetes@v1.36.4` or
# `make pin TOOL=kubernetes-1.38@v1.38.0-rc.0` (it fails, naming the proxy's reason, until the tag is served); then commit.
pin:
	$(PYTHON) -m e2e.tooling.gotools pin $(TOOL)

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

proto-check: $(STAMP)
	$(PY) scripts/gen_proto.py --check

lint: $(STAMP)
	$(PY) -m ruff check dra_driver e2e unit_tests scripts deploy
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

unit: $(STAMP)
	$(PY) -m pytest unit_tests -q $(PYTEST_ARGS)

# make test's unit suite in two parts: the chart's checks (marked helm) wait for helm, which make test's
# background worker builds after the bed's Kubernetes, so they run after make e2e instead of holding it up.
unit-no-helm: $(STAMP)
	$(PY) -m pytest unit_tests -q -m "not helm" $(PYTEST_ARGS)

unit-helm: $(STAMP)
	$(PY) -m pytest unit_tests -q -m helm $(PYTEST_ARGS)

binaries: $(STAMP)
	$(PY) -m e2e.tooling.binaries

runtime: $(STAMP)
	$(PY) -m e2e.tooling.runtime

e2e: $(STAMP) binaries runtime
	$(PY) -m pytest e2e/suites -q --durations=15 $(PYTEST_ARGS) || { cat .run/e2e-hung-stacks.txt 2>/dev/null; exit 1; }

# The smoke subset (registration, prepare/unprepare, slices, health) on the oldest supported minor.
e2e-oldest: $(STAMP) runtime
	DRA_TESTBED_KUBERNETES=1.36 $(PY) -m e2e.tooling.binaries
	DRA_TESTBED_KUBERNETES=1.36 $(PY) -m pytest e2e/suites -q -m smoke --durations=5 $(PYTEST_ARGS)

# The tests marked `next` against the next minor's kube-scheduler (1.38: built alone, with its own Go
# toolchain, until the registry serves the rest of its control plane) beside the default control plane.
e2e-next: $(STAMP)
	DRA_TESTBED_SCHEDULER=1.38 $(PY) -m e2e.tooling.binaries
	DRA_TESTBED_SCHEDULER=1.38 $(PY) -m pytest e2e/suites -q -m next $(PYTEST_ARGS)

# The image as users build it (Docker, or Podman); works with no registry (deploy/image/build.py).
image: $(STAMP)
	$(PY) deploy/image/build.py --tag $(IMAGE)

# The install path for real: the image built, a kind cluster (1 control plane, 2 workers), the chart
# installed, the e2e suite and e2e/suites/kind against it. Here with the bed's own dockerd and a kind node
# image assembled from the pins; on a host with Docker and kind, run e2e/suites/kind/run-e2e.sh directly.
e2e-kind: $(STAMP)
	DRA_KIND_BED=1 PYTHON=$(PY) e2e/suites/kind/run-e2e.sh

real-node-up: $(STAMP) binaries runtime
	$(PY) -m e2e.testbed.realnode up --kubeconfig .run/bed/kubeconfig

real-node-down: $(STAMP)
	$(PY) -m e2e.testbed.realnode down

deploy-checks: $(STAMP)
	$(PY) deploy/checks/helm.py

# e2e-oldest runs last: its Kubernetes 1.36 is the worker's last build, done beside e2e-next and
# e2e-kind, whose waits on kind and Docker leave a core idle.
test: prereqs proto-check pins-check prefetch lint unit-no-helm e2e unit-helm e2e-next e2e-kind e2e-oldest

bench: $(STAMP) binaries
	$(PY) -m e2e.bench

# The scale bench (e2e/bench/scale/): the controller beside the kube-scheduler on 500 to 5,000
# kwok nodes, under 30 minutes; writes e2e/bench/results/scale.json and scale-curve.png.
bench-scale: $(STAMP) binaries
	$(PY) -m e2e.bench.scale

cluster-up: $(STAMP) binaries
	$(PY) -m e2e.testbed.cluster up --nodes $(NODES)

cluster-down: $(STAMP)
	-$(PY) -m e2e.testbed.realnode down
	$(PY) -m e2e.testbed.cluster down

# The demo builds (e2e/demo/run.py) only the binaries it runs: its nodes are kubelet peers, so no kubelet.
demo: prereqs-demo $(STAMP)
	$(PY) -m e2e.demo $(if $(KEEP),--keep)

demo-down: $(STAMP)
	$(PY) -m e2e.demo --down

clean: cluster-down
	rm -rf $(VENV) .run .mypy_cache .ruff_cache .pytest_cache
