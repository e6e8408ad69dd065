#!/usr/bin/env bash
# Builds Kueue's controller manager (sigs.k8s.io/kueue/cmd/kueue) from the Go module proxy, for
# the Kueue cluster tests (tests/testbed/kueue.py), cached outside the repo and keyed by version,
# with Kueue's CRDs and webhook manifests copied from the same module. Rebuilt only when the
# version changes. Prints the folder on stdout (progress goes to stderr).
#
# Measured (2 cores shared with a control-plane build, Go 1.26.8): cold build 8 min 52 s including
# module downloads (user 4 min 13 s), 87 MB binary; with the binary cached, nothing.
# Env: DDPJOB_KUEUE_VERSION, DDPJOB_CACHE.
#
# sigs.k8s.io/kueue has no replace directives, so a wrapper module that requires it builds
# its cmd/kueue as released (the same way scripts/build-control-plane.sh builds etcd).
set -euo pipefail

KUEUE_VERSION="${DDPJOB_KUEUE_VERSION:-v0.17.0}"
CACHE_ROOT="${DDPJOB_CACHE:-$HOME/.cache/ddpjob}"
OUT="$CACHE_ROOT/kueue/kueue-$KUEUE_VERSION"

log() { printf '[build-kueue] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$OUT"
exec 9>"$OUT.lock"
if command -v flock >/dev/null && ! flock -n 9; then
  log "another build of $OUT is running; waiting for it"
  flock 9
fi
if [[ -x "$OUT/kueue-manager" && -f "$OUT/crds.yaml" && -f "$OUT/webhooks.yaml" ]]; then
  log "Kueue $KUEUE_VERSION present in $OUT"
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || die "Go is not installed; Kueue $KUEUE_VERSION needs Go >= 1.25 (scripts/install-test-deps.sh says how to get it)"
log "building Kueue $KUEUE_VERSION into $OUT with $(go env GOVERSION)"

WORK="$CACHE_ROOT/build/kueue-$KUEUE_VERSION"
mkdir -p "$WORK"
cd "$WORK"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0
start=$(date +%s)
if [[ ! -f go.mod ]] || ! grep -q "sigs.k8s.io/kueue $KUEUE_VERSION" go.mod; then
  rm -f go.mod go.sum
  go mod init ddpjob.local/kueuebuild >/dev/null 2>&1
  printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/kueue/cmd/kueue"\n' > tools.go
  log "go get sigs.k8s.io/kueue@$KUEUE_VERSION"
  go get "sigs.k8s.io/kueue@$KUEUE_VERSION" >"$WORK/get.log" 2>&1 || die "cannot fetch Kueue $KUEUE_VERSION: $WORK/get.log"
  go mod tidy -e >"$WORK/tidy.log" 2>&1 || log "go mod tidy reported problems: $WORK/tidy.log"
fi
SRC="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
[[ -d "$SRC/config/components/crd/bases" ]] || die "no CRDs in $SRC"
log "go build sigs.k8s.io/kueue/cmd/kueue $KUEUE_VERSION"
go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
  -o "$OUT/kueue-manager.tmp" sigs.k8s.io/kueue/cmd/kueue || die "go build of Kueue failed (see above)"
# The CRDs and the webhook configurations, as released with this version.
for f in "$SRC"/config/components/crd/bases/*.yaml; do echo "---"; cat "$f"; done > "$OUT/crds.yaml"
install -m 0644 "$SRC/config/components/webhook/manifests.yaml" "$OUT/webhooks.yaml"
mv "$OUT/kueue-manager.tmp" "$OUT/kueue-manager"
log "done in $(( $(date +%s) - start ))s: $OUT"
echo "$OUT"
