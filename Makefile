# Everyday commands. `make test` is the README's test command and what CI runs.
.PHONY: sync lint format typecheck test demo bench

sync:
	uv sync

lint:
	uv run ruff check .
	uv run ruff format --check .

format:
	uv run ruff format .
	uv run ruff check --fix .

# The benchmarks import their peers (dbos, procrastinate): check them with the bench group.
typecheck:
	uv run --group bench mypy

test: sync
	.ci/with-servers uv run pytest

demo: sync
	uv run world demo

bench:
	uv sync --group bench
	.ci/with-servers sh -c 'for b in benchmarks/bench_*.py; do uv run --group bench python "$$b" || exit 1; done'
