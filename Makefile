# The two commands of the README: `make demo` (the main job) and `make test` (the tests).
# Both run the idempotent set-up first.
SHELL := /bin/bash
ENV := source scripts/env.sh &&
# The launch tests run in `make test` where the launch stack is importable: set UQ_LAUNCH_KIT
# to a virtualenv that holds it (docs/deployment.md, "Tests of the launch files"); without it
# they skip, saying why.
# The kit's activate first deactivates .venv, restoring the PATH from before it: the
# workspace's PATH (.venv/bin, the nodes' lib folders) is appended back after the kit's.
LAUNCH_KIT := $(if $(UQ_LAUNCH_KIT),_uq_path="$$PATH" && source $(UQ_LAUNCH_KIT)/bin/activate && export PATH="$$PATH:$$_uq_path" && source install/setup.bash &&,)

.PHONY: setup demo test clean laplace mutation

setup:
	@bash scripts/setup.sh

demo: setup
	@$(ENV) uq demo

# Benchmark datasets kept in a folder beside the workspace (DATA_BESIDE, one folder per
# dataset as `uq data fetch` lays them out) are linked into data/ before the tests, so that
# the tests on the real MNIST-family data run; a dataset already in data/ is left alone.
DATA_BESIDE ?= ../shared/data
BENCHMARK_DATASETS := mnist fashion_mnist kmnist notmnist

test: setup
	@if [ -d "$(DATA_BESIDE)" ]; then \
	  for name in $(BENCHMARK_DATASETS); do \
	    if [ -d "$(DATA_BESIDE)/$$name" ] && [ ! -e "data/$$name" ] && [ ! -L "data/$$name" ]; then \
	      mkdir -p data && ln -s "$$(cd "$(DATA_BESIDE)/$$name" && pwd)" "data/$$name" \
	        && echo "linked data/$$name -> $$(readlink "data/$$name")"; \
	    fi; \
	  done; \
	fi
	@$(ENV) $(LAUNCH_KIT) python -m pytest

# Optional: laplace-torch for the peer-baseline rows of `uq bench mnist` (docs/benchmarks.md).
# --no-deps with every dependency pinned in the file: see the comment in requirements/laplace.txt.
laplace: setup
	@$(ENV) python -m pip install -q --no-deps -c requirements/constraints.txt -r requirements/laplace.txt \
		&& python -c 'import laplace; from importlib.metadata import version; print("laplace-torch", version("laplace-torch"), "installed")'

# Mutation testing of ROS-free modules with their own tests (docs/testing.md, "Mutation
# testing"); never part of `make test`. MODULES: source files under src/; TESTS: test files to
# run instead of the module's own (scripts/mutation_tests.txt, else those that import it).
# Installs the pinned mutmut on first use (requirements/mutation.in).
mutation:
	@$(ENV) python scripts/mutation.py $(if $(TESTS),--tests $(TESTS)) $(MODULES)

clean:
	rm -rf build install log .venv out
