#!/usr/bin/env bash
# A World backend OUTSIDE this repository, run against the conformance suite in one command.
# world-core and world-conformance are not published, and `uv sync` in the workspace removes
# whatever `uv pip install -e` added, so an outside backend gets them as wheels: built here with
# `uv build` into the backend's ./wheels, named by its [tool.uv.sources] (see
# conformance/example_backend/README.md). The backend is copied to a temporary folder first, so
# nothing of this workspace (its .venv, its lock, its sources) can leak into the run.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/world-outside.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset VIRTUAL_ENV UV_PROJECT_ENVIRONMENT

cp -R "$repo/conformance/example_backend" "$work/backend"
rm -rf "$work/backend/.venv" "$work/backend/wheels" "$work/backend/uv.lock"
for package in world-core world-conformance; do
  (cd "$repo" && uv build --quiet --package "$package" --wheel --out-dir "$work/backend/wheels")
done
ls "$work/backend/wheels"

cd "$work/backend"
uv sync --quiet
# The one line a backend author runs: every contract against the installed entry point.
uv run pytest --pyargs world_conformance --world memory_example -q "$@"
