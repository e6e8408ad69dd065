#!/usr/bin/env bash
# The README's test command: installs what is missing, builds (once, cached) the control-plane
# binaries, then runs every test tier this machine can run: unit, multi-process (real gloo
# ranks) and cluster (a real kube-apiserver/etcd/controller-manager/scheduler started by the
# tests). kind and gpu tests skip themselves with their reason where there is no Docker or GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[[ -x scripts/install-test-deps.sh ]] && bash scripts/install-test-deps.sh
DDPJOB_CONTROL_PLANE_DIR="$(bash scripts/build-control-plane.sh)"
export DDPJOB_CONTROL_PLANE_DIR
set +e
python3 -m pytest -ra "$@"
rc=$?
set -e
# pytest exits 5 when no test was collected: that is a failure of this command, not a pass.
exit $rc
