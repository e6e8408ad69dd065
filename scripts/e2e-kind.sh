#!/usr/bin/env bash
# The end-to-end suite against a kind cluster (`make e2e-kind`), on a machine with a Docker
# engine, kind and kubectl:
#   1. create the kind cluster if it is absent (one node: hostPath dirs shared between pods,
#      as the checkpoint tests need, are then one directory);
#   2. build the trainer and operator images, tagged as examples/ and manifests/ name them
#      (so they are used as written, imagePullPolicy IfNotPresent), and `kind load` them;
#   3. load the Python image the test bed's smoke pods use;
#   4. apply manifests/ (CRD, namespace, RBAC, the operator Deployment) and wait for it;
#   5. run `pytest -m cluster` with DDPJOB_E2E_TARGET=kind.
# Environment: KIND_CLUSTER_NAME (default ddpjob-e2e), DDPJOB_TRAINER_IMAGE,
# DDPJOB_OPERATOR_IMAGE, DDPJOB_E2E_PYTHON_IMAGE, KIND_NODE_IMAGE (passed to kind create).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[e2e-kind] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for tool in docker kind kubectl python3; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH (this script needs docker, kind, kubectl)"
done
docker info >/dev/null 2>&1 || die "no Docker engine answers \`docker info\`"
[[ -f trainer/Dockerfile ]] || die "trainer/Dockerfile is missing"
[[ -f manifests/operator.Dockerfile ]] || die "manifests/operator.Dockerfile is missing"

CLUSTER="${KIND_CLUSTER_NAME:-ddpjob-e2e}"
CONTEXT="kind-$CLUSTER"
# The image names the repository's own files use, unless overridden.
first_image() {  # first `image:` value in a YAML file
  python3 -c 'import re,sys; m=re.search(r"^\s*image:\s*(\S+)", open(sys.argv[1]).read(), re.M); print(m.group(1) if m else "")' "$1"
}
TRAINER_IMAGE="${DDPJOB_TRAINER_IMAGE:-$(first_image examples/ddpjob.yaml)}"
OPERATOR_IMAGE="${DDPJOB_OPERATOR_IMAGE:-$(first_image manifests/operator.yaml)}"
PYTHON_IMAGE="${DDPJOB_E2E_PYTHON_IMAGE:-python:3.11-slim}"
[[ -n "$TRAINER_IMAGE" && -n "$OPERATOR_IMAGE" ]] || die "cannot read the image names from examples/ddpjob.yaml and manifests/operator.yaml"

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "using the existing kind cluster $CLUSTER"
else
  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 180s ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
fi
kubectl config use-context "$CONTEXT" >/dev/null

log "building $TRAINER_IMAGE and $OPERATOR_IMAGE"
docker build -t "$TRAINER_IMAGE" -f trainer/Dockerfile .
docker build -t "$OPERATOR_IMAGE" -f manifests/operator.Dockerfile .
docker image inspect "$PYTHON_IMAGE" >/dev/null 2>&1 || docker pull "$PYTHON_IMAGE"
log "loading images into $CLUSTER"
kind load docker-image --name "$CLUSTER" "$TRAINER_IMAGE" "$OPERATOR_IMAGE" "$PYTHON_IMAGE"

log "applying manifests/"
# Server-side: the CRD is too large for client-side apply's last-applied annotation.
if [[ -f manifests/kustomization.yaml ]]; then
  kubectl apply --server-side --force-conflicts -k manifests/
else
  kubectl apply --server-side --force-conflicts -f manifests/
fi
if [[ -n "${DDPJOB_OPERATOR_IMAGE:-}" ]]; then
  kubectl -n ddpjob-system set image deployment/ddpjob-operator "*=$OPERATOR_IMAGE"
fi
# A rebuilt image under the same tag needs new pods to be used.
kubectl -n ddpjob-system rollout restart deployment/ddpjob-operator
kubectl -n ddpjob-system rollout status deployment/ddpjob-operator --timeout=180s

log "running the suite against $CONTEXT"
export DDPJOB_E2E_TARGET=kind DDPJOB_KIND_CONTEXT="$CONTEXT"
export DDPJOB_TRAINER_IMAGE="$TRAINER_IMAGE" DDPJOB_E2E_PYTHON_IMAGE="$PYTHON_IMAGE"
exec python3 -m pytest tests/cluster -m cluster -ra "$@"
