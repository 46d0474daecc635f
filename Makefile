# Two commands on a fresh machine (see README): `make demo` and `make test`.
# Both install what they need into .venv first (once; reinstalled when pyproject.toml changes).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# checkov lives in its own environment: its pins break pulumi and pytest (requirements-checkov.txt).
CHECKOV_VENV ?= .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed

.PHONY: demo plan local-run test pytest security docs benchmarks gpu-check schemas cluster-tools engine-tools clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and exactly pinned: anything else resolving torch first pulls CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[infra,trainer,tracking-server,dev]"
	touch $(STAMP)

demo: plan local-run

plan: $(STAMP)
	$(PY) -m infra.plan --stack dev --json out/plan-dev.json

local-run: $(STAMP)
	$(PY) -m trainer.local_run --output-dir runs/local

$(CHECKOV_STAMP): requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install -q -r requirements-checkov.txt
	touch $(CHECKOV_STAMP)

# The security scan first, pytest last (its summary closes the output).
test: security pytest

# The schemas, the cluster tools and the engine tools first: without them the tests that validate
# against upstream CRDs, run the control plane or drive the real Pulumi engine would skip.
# Spread over PYTEST_WORKERS processes: each stack's cluster tests on a worker of their own, mostly
# waiting on controllers while the other workers run the CPU-bound files (tests/support/parallel.py).
PYTEST_WORKERS ?= 4
PYTEST_ARGS ?=
pytest: $(STAMP) schemas cluster-tools engine-tools
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

# Pinned upstream CRDs and the pulumi-eks schema into .cache/schemas, each verified by SHA-256
# (tools/schemas.py): from the copies in tests/infra/upstream/schemas, GitHub, or the Go module
# proxy. Once laid out, a run only re-verifies (well under a second).
schemas: $(STAMP)
	$(PY) -m tools.schemas fetch

# The Kubernetes 1.32 control plane and the controllers the cluster tests run (tests/cluster/):
# built from the Go module proxy with the versions tools/cluster/*/go.mod pin, into
# .cache/cluster-tools/bin; etcd and kubectl from Debian. Warm (Go's caches): about a minute.
cluster-tools:
	bash tools/cluster/build.sh

# The real deployment engine the engine tests drive (tests/engine/): Helm, the Pulumi CLI and the
# Kubernetes provider, built from the Go module proxy at the versions tools/engine/*/go.mod pin,
# into .cache/engine-tools/bin (tools/engine/build.sh; build times in docs/testing.md).
engine-tools:
	bash tools/engine/build.sh

# checkov, offline, on the Dockerfiles and every Kubernetes object both plans render.
security: $(STAMP) $(CHECKOV_STAMP)
	$(PY) -m infra.plan.security_scan --checkov $(CHECKOV_VENV)/bin/checkov

docs: $(STAMP)
	$(PY) -m infra.plan.config_reference --write docs/configuration.md

benchmarks: $(STAMP)
	$(PY) benchmarks/throughput_overhead.py
	$(PY) benchmarks/checkpoint_stall.py
	$(PY) benchmarks/mfu.py
	$(PY) benchmarks/torchrun_sigterm.py

# On a GPU node, from the project root, with the image's own python3 (torch, numpy, PyYAML,
# transformers; no .venv, no network): the GPU tests + GPU benchmarks and a Markdown report
# (device, driver, torch/CUDA versions, date) under $(GPU_CHECK_OUT). Without a GPU it says so,
# prints the skip reasons, runs the CPU parts and exits 0. Here: make gpu-check GPU_PYTHON=.venv/bin/python
GPU_PYTHON ?= python3
# GPU_CHECK_MODE=budget: the goals only, under 10 minutes on one H100 (one device draw).
GPU_CHECK_OUT ?= out/gpu-check
GPU_CHECK_MODE ?= full
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) tools/gpu_check.py --out $(GPU_CHECK_OUT) --mode $(GPU_CHECK_MODE) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) out runs
