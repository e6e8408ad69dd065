#!/usr/bin/env bash
# Builds, from the Go module proxy, everything a kind cluster needs that Debian does not
# package: kind itself, kubelet, kubeadm, kube-proxy, kubectl (Kubernetes $DDPJOB_K8S_VERSION),
# CoreDNS, crictl and a pause binary. Cached under ~/.cache/ddpjob/kind/bin-<versions>/;
# whatever is already built is skipped (arguments: only those parts). Prints that folder on stdout (progress on stderr).
#
# Kubernetes components use the wrapper-module recipe of scripts/build-control-plane.sh (see
# there why: kubernetes/kubernetes#79384). Builds run under `nice` with GOMAXPROCS=2.
# Env: DDPJOB_K8S_VERSION, DDPJOB_KIND_VERSION, DDPJOB_COREDNS_VERSION, DDPJOB_CRICTL_VERSION,
# DDPJOB_CACHE.
set -euo pipefail
source "$(dirname "$0")/versions.sh"

OUT="$KIND_BIN_DIR"
K8S_COMPONENTS=(kubelet kubeadm kube-proxy kubectl)
log() { printf '[kind/build-binaries] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$OUT"
exec 9>"$OUT.lock"
flock 9
command -v go >/dev/null || die "Go is not installed (Kubernetes ${K8S_VERSION%.*} needs Go >= 1.26)"
export GOFLAGS="${GOFLAGS:-} -mod=mod" CGO_ENABLED=0 GOMAXPROCS="${GOMAXPROCS:-2}"
NICE=(nice -n 10)
WORK="$DDPJOB_CACHE/build/kind-$K8S_VERSION"
mkdir -p "$WORK"
start=$(date +%s)

build_k8s() {
  local dir="$WORK/kubernetes" c
  mkdir -p "$dir" && cd "$dir"
  if [[ ! -f go.mod ]] || ! grep -q "k8s.io/kubernetes $K8S_VERSION" go.mod; then
    rm -f go.mod go.sum
    go mod init ddpjob.local/kindbuild >/dev/null 2>&1
    local gomod mods staging="v0.${K8S_VERSION#v1.}"
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')" \
      || die "cannot download k8s.io/kubernetes@$K8S_VERSION"
    mods="$(awk '/=> \.\/staging\//{print $1}' "$gomod" | sort -u)"
    { echo "require k8s.io/kubernetes $K8S_VERSION"
      for m in $mods; do echo "replace $m => $m $staging"; done; } >> go.mod
    { echo '//go:build tools'; echo; echo 'package tools'; echo; echo 'import ('
      for c in "${K8S_COMPONENTS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
      echo ')'; } > tools.go
    go mod tidy -e >"$WORK/kubernetes-tidy.log" 2>&1 || log "go mod tidy reported problems: $WORK/kubernetes-tidy.log"
  fi
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  for c in "${K8S_COMPONENTS[@]}"; do
    [[ -x "$OUT/$c" ]] && continue
    log "go build $c $K8S_VERSION"
    "${NICE[@]}" go build -tags tools -trimpath -ldflags "$ldflags" -o "$OUT/$c.tmp" "k8s.io/kubernetes/cmd/$c" \
      || die "go build of $c failed"
    mv "$OUT/$c.tmp" "$OUT/$c"
  done
}

go_install() {  # go_install NAME PACKAGE@VERSION
  local name="$1" pkg="$2"
  [[ -x "$OUT/$name" ]] && return 0
  log "go install $pkg"
  GOBIN="$OUT/.gobin" "${NICE[@]}" go install -trimpath -ldflags "-s -w" "$pkg" || die "go install $pkg failed"
  mv "$OUT/.gobin/$(basename "${pkg%@*}")" "$OUT/$name"
}

build_pause() {
  [[ -x "$OUT/pause" ]] && return 0
  local dir="$WORK/pause"
  mkdir -p "$dir" && cd "$dir"
  cat > main.go <<'GO'
// pause: the sandbox container's process. Sleeps until SIGINT/SIGTERM, reaps orphans (it is
// PID 1 of the pod), as registry.k8s.io/pause does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	child := make(chan os.Signal, 16)
	signal.Notify(child, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-child:
			for {
				var status syscall.WaitStatus
				if pid, _ := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 {
					break
				}
			}
		}
	}
}
GO
  [[ -f go.mod ]] || go mod init ddpjob.local/pause >/dev/null 2>&1
  "${NICE[@]}" go build -trimpath -ldflags "-s -w" -o "$OUT/pause" . || die "go build of pause failed"
}

# Arguments: only these (pause kind crictl kubernetes coredns); default all.
targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=(pause kind crictl kubernetes coredns)
for t in "${targets[@]}"; do
  case "$t" in
    pause) build_pause ;;
    kind) go_install kind "sigs.k8s.io/kind@$KIND_VERSION" ;;
    crictl) go_install crictl "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" ;;
    kubernetes) build_k8s ;;
    coredns) go_install coredns "github.com/coredns/coredns@$COREDNS_VERSION" ;;
    *) die "unknown target $t" ;;
  esac
done
# kind's node-image files (entrypoint, systemd units) come from its module source.
GOFLAGS= go mod download "sigs.k8s.io/kind@$KIND_VERSION" >/dev/null
log "done in $(( $(date +%s) - start ))s: $OUT"
echo "$OUT"
