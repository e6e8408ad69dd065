#!/usr/bin/env bash
# Builds the real Kubernetes control-plane binaries the cluster tests run as processes:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler (from the Go module proxy),
# cached outside the repo and keyed by version. Whatever is already built is skipped.
# Prints the folder of the binaries on stdout (progress goes to stderr).
#
# Measured (2 cores, 23 GiB RAM, Go 1.26.8): cold build 5 min 51 s with an empty Go build
# cache (6 min 4 s including module downloads), peak memory 2.0 GiB; with the binaries
# cached, nothing. Env: DDPJOB_K8S_VERSION, DDPJOB_ETCD_VERSION, DDPJOB_CACHE.
#
# Why a wrapper module: k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces
# them with ./staging/... paths, so `go install k8s.io/kubernetes/cmd/...@vX` fails
# (kubernetes/kubernetes#79384). A throwaway module that requires k8s.io/kubernetes and maps
# each such module to its published v0.Y.Z tag builds the same code.
set -euo pipefail

K8S_VERSION="${DDPJOB_K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${DDPJOB_ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${DDPJOB_CACHE:-$HOME/.cache/ddpjob}"
OUT="$CACHE_ROOT/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
K8S_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)

log() { printf '[build-control-plane] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$OUT"
# Two test runs starting at once must not build into the same folder together.
exec 9>"$OUT.lock"
if command -v flock >/dev/null && ! flock -n 9; then
  log "another build of $OUT is running; waiting for it"
  flock 9
fi

missing=()
for c in "${K8S_COMPONENTS[@]}" etcd; do
  [[ -x "$OUT/$c" ]] || missing+=("$c")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "all binaries present in $OUT"
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || die "Go is not installed; Kubernetes ${K8S_VERSION%.*} needs Go >= 1.26 (scripts/install-test-deps.sh says how to get it)"
log "building ${missing[*]} into $OUT with $(go env GOVERSION) (cold: ~6 min and ~2 GiB on 2 cores)"

WORK="$CACHE_ROOT/build/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
mkdir -p "$WORK"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

build_k8s() {
  local dir="$WORK/kubernetes"
  mkdir -p "$dir"
  cd "$dir"
  if [[ ! -f go.mod ]] || ! grep -q "k8s.io/kubernetes $K8S_VERSION" go.mod; then
    rm -f go.mod go.sum
    log "creating wrapper module for k8s.io/kubernetes $K8S_VERSION"
    go mod init ddpjob.local/k8sbuild >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')" \
      || die "cannot download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy"
    # staging modules are published as v0.<minor>.<patch> for kubernetes v1.<minor>.<patch>
    local staging="v0.${K8S_VERSION#v1.}"
    local mods
    mods="$(awk '/=> \.\/staging\//{print $1}' "$gomod" | sort -u)"
    [[ -n "$mods" ]] || die "found no staging replace directives in $gomod"
    {
      echo "require k8s.io/kubernetes $K8S_VERSION"
      for m in $mods; do echo "replace $m => $m $staging"; done
    } >> go.mod
    printf 'package tools\n\nimport (\n' > tools.go
    for c in "${K8S_COMPONENTS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c" >> tools.go; done
    printf ')\n' >> tools.go
    sed -i '1i //go:build tools\n' tools.go
    log "resolving modules ($(echo "$mods" | wc -l) staging replacements)"
    # -e: tidy complains about test-only imports of the staging modules; go build below
    # reports any real resolution problem. Its output is kept for diagnosis.
    go mod tidy -e >"$WORK/kubernetes-tidy.log" 2>&1 || log "go mod tidy reported problems: $WORK/kubernetes-tidy.log"
  fi
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  for c in "${K8S_COMPONENTS[@]}"; do
    [[ -x "$OUT/$c" ]] && continue
    log "go build $c $K8S_VERSION"
    go build -tags tools -trimpath -ldflags "$ldflags" -o "$OUT/$c.tmp" "k8s.io/kubernetes/cmd/$c" \
      || die "go build of $c failed (see the messages above)"
    "$OUT/$c.tmp" --version 2>/dev/null | grep -q "$K8S_VERSION" \
      || die "$c does not report version $K8S_VERSION (the -X version stamp did not apply)"
    mv "$OUT/$c.tmp" "$OUT/$c"
  done
}

build_etcd() {
  [[ -x "$OUT/etcd" ]] && return 0
  local dir="$WORK/etcd"
  mkdir -p "$dir"
  cd "$dir"
  if [[ ! -f go.mod ]]; then
    go mod init ddpjob.local/etcdbuild >/dev/null 2>&1
    printf 'package tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
    sed -i '1i //go:build tools\n' tools.go
  fi
  log "go get go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 || die "cannot fetch etcd $ETCD_VERSION"
  go mod tidy -e >"$WORK/etcd-tidy.log" 2>&1 || log "go mod tidy reported problems: $WORK/etcd-tidy.log"
  log "go build etcd $ETCD_VERSION"
  go build -tags tools -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3 \
    || die "go build of etcd failed (see the messages above)"
  mv "$OUT/etcd.tmp" "$OUT/etcd"
}

start=$(date +%s)
build_etcd
build_k8s
log "done in $(( $(date +%s) - start ))s: $OUT"
echo "$OUT"
