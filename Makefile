# Two commands on a fresh machine (see README): `make demo` and `make test`.
# Both install what they need into .venv first (once; reinstalled when pyproject.toml changes).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo plan local-run test docs benchmarks schemas clean

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

test: $(STAMP)
	$(PY) -m pytest

# Pinned upstream CRDs and the pulumi-eks schema, verified by SHA-256 (workloads/schemas.py).
schemas: $(STAMP)
	$(PY) -m workloads.schemas fetch

docs: $(STAMP)
	$(PY) -m infra.config_reference --write README.md

benchmarks: $(STAMP)
	$(PY) benchmarks/throughput_overhead.py
	$(PY) benchmarks/checkpoint_stall.py
	$(PY) benchmarks/mfu.py
	$(PY) benchmarks/torchrun_sigterm.py

clean:
	rm -rf $(VENV) out runs
