#!/usr/bin/env bash
# Build the verl venv once: verl 0.9.1 with its own pins (tools/verl/requirements.txt, every version held
# by tools/verl/constraints.txt), CPU torch, and envforge-client editable from clients/python.
# It is rebuilt only when those files change (their hash is kept in the venv). Prints the venv's path.
# About 7 minutes from the network on 2 shared cores, 1.9 GB; `make verl-venv` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VERL_VENV:-.venv-verl}"
PYTHON="${PYTHON:-python3.11}"
# One build at a time: CI starts it in the background (.ci/run) and the test waits here for it.
exec 9>"${VENV%/}.lock"
flock 9
key=$(cat tools/verl/requirements.txt tools/verl/constraints.txt clients/python/pyproject.toml | sha256sum | cut -c1-16)
if [[ -x "$VENV/bin/python" && -f "$VENV/.requirements-key" && "$(cat "$VENV/.requirements-key")" == "$key" ]]; then
  echo "$VENV"
  exit 0
fi
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" >&2
# PYTHONPATH would let the checkout's sources hide what the venv lacks
env -u PYTHONPATH "$VENV/bin/pip" install --quiet --disable-pip-version-check \
  -c tools/verl/constraints.txt -r tools/verl/requirements.txt -e clients/python >&2
echo "$key" > "$VENV/.requirements-key"
echo "$VENV"
