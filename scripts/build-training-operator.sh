#!/usr/bin/env bash
# Builds Kubeflow's training-operator (PyTorchJob, the peer benchmarks/peers.py compares DDPJob
# with) from the Go module proxy, cached outside the repo and keyed by version; rebuilt only
# when the version changes. Prints the folder with the binary and its CRDs on stdout.
#
#   OUT/training-operator      go install .../cmd/training-operator.v1@VERSION
#   OUT/crds/*.yaml            manifests/base/crds from the same module
#
# Measured (2 cores, Go 1.26.8): about 2 min cold. Env: DDPJOB_TRAINING_OPERATOR_VERSION,
# DDPJOB_CACHE.
set -euo pipefail

VERSION="${DDPJOB_TRAINING_OPERATOR_VERSION:-v1.8.1}"
CACHE_ROOT="${DDPJOB_CACHE:-$HOME/.cache/ddpjob}"
OUT="$CACHE_ROOT/peers/training-operator-$VERSION"
MODULE=github.com/kubeflow/training-operator

log() { printf '[build-training-operator] %s\n' "$*" >&2; }

mkdir -p "$OUT"
exec 9>"$OUT.lock"
if command -v flock >/dev/null && ! flock -n 9; then
  log "another build of $OUT is running; waiting for it"
  flock 9
fi
if [[ -x "$OUT/training-operator" && -d "$OUT/crds" ]]; then
  log "present: $OUT"
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { log "ERROR: Go is not installed"; exit 1; }
log "building $MODULE $VERSION into $OUT with $(go env GOVERSION) (~2 min cold on 2 cores)"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath"
GOBIN="$OUT/bin.tmp" nice -n 10 go install -ldflags "-s -w" "$MODULE/cmd/training-operator.v1@$VERSION"
mv "$OUT/bin.tmp/training-operator.v1" "$OUT/training-operator"
rmdir "$OUT/bin.tmp"
dir="$(go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
rm -rf "$OUT/crds.tmp" && mkdir -p "$OUT/crds.tmp"
cp "$dir"/manifests/base/crds/*.yaml "$OUT/crds.tmp/"
chmod -R u+w "$OUT/crds.tmp" && mv "$OUT/crds.tmp" "$OUT/crds"
log "built: $OUT"
echo "$OUT"
