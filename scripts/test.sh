#!/usr/bin/env bash
# The README's test command: installs what is missing, builds (once, cached) the control-plane
# binaries, then runs every test tier this machine can run: unit, multi-process (real gloo
# ranks) and cluster (a real kube-apiserver/etcd/controller-manager/scheduler started by the
# tests). gpu tests skip themselves where there is no GPU. DDPJOB_TEST_KIND=1 adds the kind
# tier (scripts/e2e-kind.sh) after the others.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[[ -x scripts/install-test-deps.sh ]] && bash scripts/install-test-deps.sh
DDPJOB_CONTROL_PLANE_DIR="$(bash scripts/build-control-plane.sh)"
export DDPJOB_CONTROL_PLANE_DIR
set +e
python3 -m pytest -ra "$@"
rc=$?
# The kind tier (a real kind cluster with the real images, scripts/e2e-kind.sh) only when asked:
# cold, its builds alone take longer than CI's budget allows next to the rest (docs/testing.md).
if [[ "${DDPJOB_TEST_KIND:-0}" == 1 ]]; then
  bash scripts/e2e-kind.sh
  kind_rc=$?
  [[ $rc -eq 0 ]] && rc=$kind_rc
fi
set -e
# pytest exits 5 when no test was collected: that is a failure of this command, not a pass.
exit $rc
