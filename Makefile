# Each target sets up .venv on its own (scripts/bootstrap is idempotent), so a fresh clone needs
# nothing else: `make example` (the main job) and `make test` (the test suite).
.PHONY: setup example test test-fast lint format

setup:
	@scripts/bootstrap

example: setup
	.venv/bin/clover-agent fix test_add --repo examples/calculator

# Both run in parallel, one worker per CPU (pytest-xdist; the distribution mode is in pyproject.toml).
# `make test` also writes every item's outcome and time to build/test-report.xml (JUnit XML).
test: setup
	.venv/bin/python -m pytest -n auto --durations=25 --junitxml=build/test-report.xml

# The inner loop: no Docker, nothing slow.
test-fast: setup
	.venv/bin/python -m pytest -n auto -m "not docker and not slow"

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python scripts/typecheck.py

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .
