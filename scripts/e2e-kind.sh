#!/usr/bin/env bash
# `make e2e-kind`: the end-to-end suite (tests/cluster, marker `cluster`) against a kind cluster
# with DDPJOB_E2E_TARGET=kind:
#   1. scripts/kind/up.sh: the Docker engine (the project's own dockerd where none is set up),
#      kind, the node image (built offline where no registry answers), a 1 control-plane +
#      2 worker cluster, the trainer and operator images (scripts/images.sh) loaded, manifests/
#      applied and the operator Deployment Ready (each step cached; an existing cluster is
#      reused);
#   2. pytest tests/cluster against it (extra arguments go to pytest): the tests marked `kubelet`
#      (what a real kubelet or the real images change: one test per feature, and the node
#      agent's parity tests; the test bed runs every test, these included), or with
#      DDPJOB_KIND_SUITE=all the whole end-to-end suite (`-m cluster`);
#   3. scripts/kind/down.sh, unless DDPJOB_KIND_KEEP=1 (then `make kind-down` later).
# Where Docker cannot run at all, it says why and exits 0 with the tier skipped
# (DDPJOB_KIND_REQUIRED=1 makes that a failure).
# Env: KIND_CLUSTER_NAME (ddpjob), DDPJOB_KIND_SUITE (kubelet or all), DDPJOB_OFFLINE, DDPJOB_KIND_KEEP, DDPJOB_KIND_REQUIRED.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/kind/lib.sh
LOG_TAG=e2e-kind
CLUSTER="${KIND_CLUSTER_NAME:-ddpjob}"

skip() {
  log "SKIPPED: kind tier needs a Docker engine: $*"
  [[ "${DDPJOB_KIND_REQUIRED:-}" == 1 ]] && exit 1
  exit 0
}
why_not="$(docker_unavailable_reason)"
[[ -z "$why_not" ]] || skip "$why_not"

cleanup() { [[ "${DDPJOB_KIND_KEEP:-}" == 1 ]] || bash scripts/kind/down.sh; }
trap cleanup EXIT
start=$SECONDS
exports="$(bash scripts/kind/up.sh)"
eval "$exports"
log "cluster ready in $((SECONDS - start)) s"
eval "$(bash scripts/kind/dockerd.sh env)"
export DOCKER_HOST KUBECONFIG
[[ -x "$KIND_BIN_DIR/kind" ]] && export PATH="$KIND_BIN_DIR:$PATH"
# The test-bed parity tests' plain Python image (scripts/kind/prepare.sh built or pulled it).
if registry_reachable; then
  PYTHON_IMAGE="${DDPJOB_E2E_PYTHON_IMAGE:-python:3.11-slim}"
else
  PYTHON_IMAGE="${DDPJOB_E2E_PYTHON_IMAGE:-$LOCAL_PYTHON_TEST_IMAGE}"
fi
image_exists "$PYTHON_IMAGE" || die "$PYTHON_IMAGE is missing (scripts/kind/prepare.sh makes it)"
workers="$(kind get nodes --name "$CLUSTER" | grep -v control-plane | paste -sd, -)"
kind load docker-image --name "$CLUSTER" --nodes "$workers" "$PYTHON_IMAGE" >/dev/null
log "running the suite ($((SECONDS - start)) s)"
export DDPJOB_E2E_TARGET=kind DDPJOB_KIND_CONTEXT="kind-$CLUSTER"
export DDPJOB_KIND_SHARED_DIR="$DDPJOB_CACHE/kind/shared-$CLUSTER"
export DDPJOB_TRAINER_IMAGE="$TRAINER_IMAGE"
export DDPJOB_E2E_PYTHON_IMAGE="$PYTHON_IMAGE"
export PYTHONPATH="$PWD/operator:$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}"
case "${DDPJOB_KIND_SUITE:-kubelet}" in
  kubelet) selection="cluster and kubelet" ;;
  all) selection="cluster" ;;
  *) die "DDPJOB_KIND_SUITE must be kubelet or all, not '${DDPJOB_KIND_SUITE}'" ;;
esac
set +e
python3 -m pytest tests/cluster -m "$selection" -ra -p no:cacheprovider "$@"
rc=$?
set -e
log "suite finished in $((SECONDS - start)) s (rc $rc)"
exit $rc
