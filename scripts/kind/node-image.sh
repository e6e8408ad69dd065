#!/usr/bin/env bash
# Builds the kind node image for Kubernetes $K8S_VERSION without a registry:
# localhost/ddpjob/kind-node:<version>, labelled with a key of every version and input file,
# so it is rebuilt only when one changes. Steps (each cached):
#   1. binaries: scripts/kind/build-binaries.sh (kubelet, kubeadm, kubectl, kube-proxy, CoreDNS,
#      crictl, pause) and scripts/build-control-plane.sh (etcd, kube-apiserver,
#      kube-controller-manager, kube-scheduler);
#   2. component images (images/k8s-component/Dockerfile), tagged with the names kubeadm
#      expects (`kubeadm config images list`), except etcd, tagged with its real version (the
#      cluster config points kubeadm at it); saved as tars;
#   3. the node image (images/kind-node/Dockerfile) on localhost/ddpjob/kind-node-base
#      (scripts/kind/debian-images.sh) with kind's images/base files from its Go module.
# Prints the image name on stdout.
set -euo pipefail
LOG_TAG=kind/node-image
source "$(dirname "$0")/lib.sh"
use_docker

BIN="$(bash "$KIND_SCRIPTS/build-binaries.sh")"
CP="$(DDPJOB_K8S_VERSION="$K8S_VERSION" DDPJOB_ETCD_VERSION="$ETCD_VERSION" bash "$REPO_ROOT/scripts/build-control-plane.sh")"
KIND_MODULE="$(GOFLAGS= go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
ETCD_TAG="${ETCD_VERSION#v}-0"
key="$( (echo "$K8S_VERSION $ETCD_VERSION $KIND_VERSION $COREDNS_VERSION $CRICTL_VERSION $DEBIAN_SUITE"
         cat "$REPO_ROOT"/images/kind-node/* "$REPO_ROOT"/images/k8s-component/Dockerfile "$0") | sha256sum | cut -c1-16)"
if [[ "$(docker image inspect -f '{{index .Config.Labels "dev.ddpjob.key"}}' "$LOCAL_NODE_IMAGE" 2>/dev/null)" == "$key" ]]; then
  log "$LOCAL_NODE_IMAGE is up to date"
  echo "$LOCAL_NODE_IMAGE"; exit 0
fi
start=$SECONDS
bash "$KIND_SCRIPTS/debian-images.sh" iptables node

CTX="$DDPJOB_CACHE/kind/node-context"
rm -rf "$CTX"; mkdir -p "$CTX/bin" "$CTX/images/common" "$CTX/images/control-plane" "$CTX/node" "$CTX/component"
mapfile -t wanted < <("$BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
image_for() { printf '%s\n' "${wanted[@]}" | grep -m1 "/$1:" || die "kubeadm lists no $1 image"; }
PAUSE_IMAGE="$(image_for pause)"

component() {  # component WHERE NAME BINARY_PATH TAG [BASE [ENTRYPOINT]]
  local where="$1"; shift
  local name="$1" binary="$2" tag="$3" base="${4:-scratch}"
  cp "$binary" "$CTX/component/$name"
  docker_build -q --build-arg "BASE=$base" --build-arg "BINARY=$name" -t "$tag" \
    -f "$REPO_ROOT/images/k8s-component/Dockerfile" "$CTX/component" >/dev/null
  rm -f "$CTX/component/$name"
  if [[ -n "${5:-}" ]]; then  # an entrypoint: set it on the image
    local id; id="$(docker create "$tag" "$5")"
    docker commit --change "ENTRYPOINT [\"$5\"]" --change "CMD []" "$id" "$tag" >/dev/null
    docker rm "$id" >/dev/null
  fi
  docker save "$tag" -o "$CTX/images/$where/$name.tar"
  log "image $tag"
}
for c in kube-apiserver kube-controller-manager kube-scheduler; do component control-plane "$c" "$CP/$c" "$(image_for "$c")"; done
component control-plane etcd "$CP/etcd" "registry.k8s.io/etcd:$ETCD_TAG"
component common kube-proxy "$BIN/kube-proxy" "$(image_for kube-proxy)" "localhost/ddpjob/iptables-base:$DEBIAN_SUITE"
component common coredns "$BIN/coredns" "$(image_for coredns)" scratch /usr/local/bin/coredns
component common pause "$BIN/pause" "$PAUSE_IMAGE" scratch /usr/local/bin/pause

cp -r "$KIND_MODULE/images/base/files" "$CTX/kind"; chmod -R u+w "$CTX/kind"
rm -f "$CTX/kind/etc/containerd/config.toml" "$CTX/kind/etc/systemd/system/containerd-fuse-overlayfs.service"
cp "$BIN/kubelet" "$BIN/kubeadm" "$BIN/kubectl" "$BIN/crictl" "$CTX/bin/"
cp "$REPO_ROOT"/images/kind-node/* "$CTX/node/"
sed -i "s#@PAUSE_IMAGE@#$PAUSE_IMAGE#" "$CTX/node/containerd-config.toml"
echo "$K8S_VERSION" > "$CTX/node/version"
cp "$REPO_ROOT/images/kind-node/Dockerfile" "$CTX/Dockerfile"
log "building $LOCAL_NODE_IMAGE"
docker_build -q --build-arg "BASE=localhost/ddpjob/kind-node-base:$DEBIAN_SUITE" \
  --build-arg "K8S_VERSION=$K8S_VERSION" --label "dev.ddpjob.key=$key" \
  --label "dev.ddpjob.etcd-image-tag=$ETCD_TAG" -t "$LOCAL_NODE_IMAGE" "$CTX" >/dev/null
rm -rf "$CTX"
prune_replaced
log "$LOCAL_NODE_IMAGE: $(docker image inspect -f '{{.Size}}' "$LOCAL_NODE_IMAGE" | awk '{printf "%.2f GB", $1/1e9}') in $((SECONDS - start)) s"
echo "$LOCAL_NODE_IMAGE"
