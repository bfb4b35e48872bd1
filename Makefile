# Each target sets up .venv on its own (scripts/bootstrap is idempotent), so a fresh clone needs
# nothing else: `make example` (the main job) and `make test` (the test suite).
.PHONY: setup example test lint format

setup:
	@scripts/bootstrap

example: setup
	.venv/bin/clover-agent fix test_add --repo examples/calculator

test: setup
	.venv/bin/python -m pytest --durations=25

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python scripts/typecheck.py

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .
