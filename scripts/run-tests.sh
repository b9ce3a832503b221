#!/usr/bin/env bash
# Runs the whole suite; pytest's exit code 5 (no test collected) is a failure, not a success.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests bench tools examples || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run-tests: no test was collected or run: failing" >&2
  exit 1
fi
exit "$rc"
