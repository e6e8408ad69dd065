#!/usr/bin/env bash
# Base images built from Debian packages (no registry needed): each is a `mmdebstrap
# --variant=minbase` root filesystem piped into `docker import`, tagged with the suite and a
# hash of its package list, so it is rebuilt only when that changes.
#   localhost/ddpjob/python-base:<suite>     python3 + venv: the trainer and operator images' base
#   localhost/ddpjob/iptables-base:<suite>   iptables + conntrack: the kube-proxy image's base
#   localhost/ddpjob/kind-node-base:<suite>  systemd, containerd, runc, CNI plugins: the kind node
# Usage: debian-images.sh [python|iptables|node]...   (default: all)
set -euo pipefail
LOG_TAG=kind/debian-images
source "$(dirname "$0")/lib.sh"
use_docker
command -v mmdebstrap >/dev/null || apt_install mmdebstrap

MIRRORS=(
  "deb http://deb.debian.org/debian $DEBIAN_SUITE main"
  "deb http://deb.debian.org/debian $DEBIAN_SUITE-updates main"
  "deb http://deb.debian.org/debian-security $DEBIAN_SUITE-security main"
)
# Leave out what no container reads: documentation, manual pages, translations.
SLIM=(
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --aptopt='Acquire::Languages "none"'
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log'
)

build() {  # build NAME "PKG,PKG" [docker import --change ...]
  local name="$1" packages="$2"; shift 2
  local tag="localhost/ddpjob/$name:$DEBIAN_SUITE"
  local key; key="$(echo "$DEBIAN_SUITE $packages $*" | sha256sum | cut -c1-12)"
  if [[ "$(docker image inspect -f '{{index .Config.Labels "dev.ddpjob.key"}}' "$tag" 2>/dev/null)" == "$key" ]]; then
    log "$tag is up to date"; return 0
  fi
  log "mmdebstrap $DEBIAN_SUITE + $packages -> $tag"
  local start=$SECONDS
  mmdebstrap --quiet --variant=minbase --include="$packages" "${SLIM[@]}" "$DEBIAN_SUITE" - "${MIRRORS[@]}" \
    | docker import --change "LABEL dev.ddpjob.key=$key" "$@" - "$tag" >/dev/null
  log "$tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}') in $((SECONDS - start)) s"
}

ENV_PATH='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
python_base() {
  build python-base "python3,python3-venv,ca-certificates" --change "$ENV_PATH" \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]'
}
iptables_base() {
  build iptables-base "iptables,conntrack,kmod,ca-certificates" --change "$ENV_PATH"
}
node_base() {
  # What kind's images/base installs (kind v0.33.0), from Debian: containerd, runc and the CNI
  # plugins are Debian's (1.6.20, 1.1.5, 1.1.1), not kind's own builds.
  build kind-node-base "systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,jq,procps,containerd,runc,containernetworking-plugins,socat,hostname,e2fsprogs,findutils" \
    --change "$ENV_PATH" --change 'ENV container=docker'
  # (STOPSIGNAL and ENTRYPOINT: images/kind-node/Dockerfile; `docker import` cannot set the former)
}

targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=(python iptables node)
for t in "${targets[@]}"; do
  case "$t" in
    python) python_base ;; iptables) iptables_base ;; node) node_base ;;
    *) die "unknown base image $t (python, iptables, node)" ;;
  esac
done
