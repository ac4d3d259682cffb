# The two commands of the README: `make demo` (the main job) and `make test` (the tests).
# Both run the idempotent set-up first.
SHELL := /bin/bash
ENV := source scripts/env.sh &&

.PHONY: setup demo test lint clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(ENV) uq demo

test: setup
	@$(ENV) python -m pytest

clean:
	rm -rf build install log .venv out
