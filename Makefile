# Everyday commands. `make test` is the README's test command and what CI runs.
.PHONY: sync lint format typecheck test demo bench bench-targets bench-quick chaos

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

# Three pytest-xdist workers: much of a test's time is waiting (child processes starting, leases
# running out, servers answering), so three keep two cores busy. Every test opens a namespace or
# folder of its own and servers on free ports; the MongoDB tests keep to one worker (their
# single-threaded test server: world_mongo/tests/conftest.py), hence --dist loadgroup.
TEST_WORKERS ?= 3
test: sync
	.ci/with-servers uv run pytest -n $(TEST_WORKERS) --dist loadgroup

demo: sync
	uv run world demo

# Every benchmark script with its defaults (bench_targets.py, which runs the others' measures
# again, is left to bench-targets).
bench:
	uv sync --group bench
	.ci/with-servers sh -c 'for b in benchmarks/bench_*.py; do [ "$$b" = benchmarks/bench_targets.py ] || uv run --group bench python "$$b" || exit 1; done'

# Issue 17's target rows, each with its floor or peer, in one run and one table (about half
# an hour; BENCH_TARGETS_ARGS=--quick for a smoke run, --skip-scale without the scale run).
bench-targets:
	uv sync --group bench
	.ci/with-servers uv run --group bench python benchmarks/bench_targets.py $(BENCH_TARGETS_ARGS)

# Every benchmark once with --quick: checks each still runs and ends with its JSON (CI runs it).
bench-quick:
	uv sync --group bench
	.ci/with-servers uv run --group bench python benchmarks/smoke.py

# Workers killed (SIGKILL) and paused (SIGSTOP past their lease) at random while turns call two
# never tools against a loopback sink that honours idempotency keys: exits 1 on a lost turn or
# an effect applied twice. About 40 s per backend.
chaos: sync
	.ci/with-servers sh -c 'uv run python benchmarks/chaos_journal.py --world local,postgres,redis'
