# Each target sets up .venv on its own (scripts/bootstrap is idempotent), so a fresh clone needs
# nothing else: `make example` (the main job) and `make test` (the test suite).
.PHONY: setup example test test-fast lint format

setup:
	@scripts/bootstrap

example: setup
	.venv/bin/clover-agent fix test_add --repo examples/calculator

# Both run in parallel (pytest-xdist; the distribution mode is in pyproject.toml) with one worker more
# than CPUs: a good part of the suite's item time waits on containers, deadlines and child
# processes rather than computing (bench/RESULTS.md: 12 min 0 s with 3 workers on 2 cores against
# 14 min 9 s with 2). A PYTEST_XDIST_AUTO_NUM_WORKERS of your own wins.
# `make test` also writes every item's outcome and time to build/test-report.xml (JUnit XML).
export PYTEST_XDIST_AUTO_NUM_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: setup
	.venv/bin/python -m pytest -n auto --durations=25 --junitxml=build/test-report.xml

# The inner loop: no Docker, nothing slow.
test-fast: setup
	.venv/bin/python -m pytest -n auto -m "not docker and not slow"

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python -m mypy

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .
