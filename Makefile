# Every target builds .venv from scratch when it is missing, so a fresh clone
# needs only Python 3.11: `make demo` and `make test` are the whole set-up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-offline test lint typecheck unit bench fuzz clean kube-binaries kube-real

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/jobs/demo.py

# The offline tour: manifests checked, snapshots planned by Ray's arithmetic and ours,
# the busy-slice workload simulated under both (no Ray processes started).
demo-offline: $(STAMP)
	@for manifest in examples/clusters/*.yaml examples/jobs-and-services/*.yaml; do \
		echo "== tpu-autoscaler validate $$manifest"; \
		$(BIN)/tpu-autoscaler validate $$manifest || exit 1; echo; \
	done
	@for snapshot in examples/snapshots/*.yaml; do \
		echo "== $$snapshot"; \
		echo "-- Ray 2.60 + KubeRay (--policy ray):"; \
		$(BIN)/tpu-autoscaler plan --policy ray $$snapshot || exit 1; \
		echo "-- tpu-autoscaler (--policy slice):"; \
		$(BIN)/tpu-autoscaler plan $$snapshot || exit 1; echo; \
	done
	@for policy in ray slice; do \
		echo "== simulate busy-slice.yaml on the v6e 4x4 cluster, --policy $$policy"; \
		$(BIN)/tpu-autoscaler simulate --cluster examples/clusters/v6e-4x4-multihost.yaml \
			--workload examples/workloads/busy-slice.yaml --policy $$policy || exit 1; echo; \
	done

lint: $(STAMP)
	$(BIN)/ruff check tpu_autoscaler tests $(wildcard benchmarks/*.py tools/*.py)
	$(BIN)/ruff format --check tpu_autoscaler tests $(wildcard benchmarks/*.py tools/*.py)

typecheck: $(STAMP)
	$(BIN)/mypy --strict tpu_autoscaler

unit: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck unit

bench: $(STAMP)
	@for script in benchmarks/bench_*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

# The simulated-cluster state machines on random examples (CI runs them derandomized):
# for a nightly job or an idle machine. EXAMPLES per machine; a failure exits 1 with
# its steps and a reproduce blob.
EXAMPLES ?= 200
fuzz: $(STAMP)
	$(BIN)/python tools/fuzz_machines.py --examples $(EXAMPLES)

# A real kube-apiserver 1.20.2 and etcd for the kube_real tests (tests/realkube), built
# from Debian's packages into a cache outside the clone (root, apt; minutes the first
# time, instant after): see tools/build-kube.sh.
kube-binaries:
	bash tools/build-kube.sh

# That tier alone (make test runs it too); skipped with one line without the binaries.
kube-real: $(STAMP)
	$(BIN)/python -m pytest -q tests/realkube

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
