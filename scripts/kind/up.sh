#!/usr/bin/env bash
# `make kind-up`: a kind cluster (1 control-plane + 2 workers) running DDPJob's operator.
#   1. Docker: the engine in DOCKER_HOST, or the project's own dockerd (scripts/kind/dockerd.sh);
#   2. kind and the node image: where a public registry answers, kind from PATH (or built) and
#      kind's stock node image; where none does, kind, the node image and the CNI are built
#      here (scripts/kind/build-binaries.sh, node-image.sh, cni.sh), cached in ~/.cache/ddpjob;
#   3. `kind create cluster` (pod subnet 10.245.0.0/16; a host folder mounted into every node
#      at the same path, so a hostPath volume there is one folder shared by all nodes (and the host),
#      as a shared volume would be);
#   4. the trainer and operator images (scripts/images.sh, cached) loaded into the workers;
#   5. `kubectl apply --server-side -k manifests/`, then waits for the operator Deployment.
# Prints the kubeconfig to use. Env: KIND_CLUSTER_NAME (ddpjob), DDPJOB_KIND_WORKERS (2),
# DDPJOB_OFFLINE (1/0: force the offline/online path), KIND_NODE_IMAGE, DDPJOB_KIND_KEEP_IMAGES (1/0).
set -euo pipefail
LOG_TAG=kind/up
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
CLUSTER="${KIND_CLUSTER_NAME:-ddpjob}"
WORKERS="${DDPJOB_KIND_WORKERS:-2}"
KUBECONFIG_FILE="$DDPJOB_CACHE/kind/$CLUSTER.kubeconfig"
SHARED_DIR="$DDPJOB_CACHE/kind/shared-$CLUSTER"
POD_SUBNET="${DDPJOB_KIND_POD_SUBNET:-10.245.0.0/16}"
NETWORK_SUBNET="${DDPJOB_KIND_NETWORK_SUBNET:-172.29.0.0/16}"
start=$SECONDS
stage() { log "[$((SECONDS - start)) s] $*"; }

use_docker
user_kubectl="$(command -v kubectl || true)"  # the user's own; else the one built below is printed
stage "binaries and images (scripts/kind/prepare.sh; cached)"
bash "$KIND_SCRIPTS/prepare.sh"
if registry_reachable; then
  OFFLINE=0
  KIND="$(command -v kind || echo "$(bash "$KIND_SCRIPTS/build-binaries.sh" kind)/kind")"
  NODE_IMAGE="${KIND_NODE_IMAGE:-}"
else
  OFFLINE=1
  BIN="$(bash "$KIND_SCRIPTS/build-binaries.sh")"
  KIND="$BIN/kind"
  export PATH="$BIN:$PATH"   # kubectl of the cluster's version
  NODE_IMAGE="${KIND_NODE_IMAGE:-$(bash "$KIND_SCRIPTS/node-image.sh")}"
fi
export KIND
command -v kubectl >/dev/null || die "kubectl is not on PATH"

# Each worker's containerd store (/var/lib/containerd) outlives the cluster, in a Docker volume
# of its own: a later kind-up finds the trainer image (5 GB) already there under the same ID and
# "kind load" skips it, where loading it anew writes ~20 GB and took ~290 s on 2 cores. Docker
# fills a new volume from the node image's own /var/lib/containerd (the node imports pause,
# CoreDNS and kube-proxy at boot either way), and a new node image gets new volumes. What the last cluster's pods left in the store, the kubelet
# collects as containers of pods it does not know. DDPJOB_KIND_KEEP_IMAGES=0: fresh stores.
# (Only for a node image of our own or named: kind's stock one is pulled by kind create.)
KEEP_IMAGES="${DDPJOB_KIND_KEEP_IMAGES:-1}"
[[ -n "$NODE_IMAGE" ]] || KEEP_IMAGES=0
worker_image_store() {  # worker number, node image ID -> the host path of its store's volume
  local volume prefix="ddpjob-kind-containerd-$CLUSTER-w$1-"
  volume="$prefix${2#sha256:}"; volume="${volume:0:${#prefix}+12}"
  { docker volume ls -q | grep "^$prefix" | grep -vx "$volume" || true; } | xargs -r docker volume rm >/dev/null
  if ! docker volume inspect "$volume" >/dev/null 2>&1; then
    # Docker copies the image's files into an empty volume when a container first mounts it.
    docker volume create "$volume" >/dev/null &&
      docker run --rm -v "$volume:/var/lib/containerd" --entrypoint true "$NODE_IMAGE" >&2 ||
      { docker volume rm -f "$volume" >/dev/null 2>&1; return 1; }
  fi
  docker volume inspect -f '{{.Mountpoint}}' "$volume"
}

if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  stage "kind cluster $CLUSTER exists"
else
  mkdir -p "$SHARED_DIR"; chmod 1777 "$SHARED_DIR"
  if [[ $OFFLINE == 1 ]] && ! docker network inspect kind >/dev/null 2>&1; then
    # kind reuses a network named "kind"; its subnet must not clash with other bridges here.
    docker network create kind --subnet "$NETWORK_SUBNET" \
      -o com.docker.network.bridge.enable_ip_masquerade=false >/dev/null
  fi
  stores=()
  if [[ $KEEP_IMAGES == 1 ]]; then
    node_image_id="$(docker image inspect -f '{{.Id}}' "$NODE_IMAGE")"
    for n in $(seq 1 "$WORKERS"); do
      stores+=("$(worker_image_store "$n" "$node_image_id")") || die "worker $n's image store"
    done
  fi
  config="$DDPJOB_CACHE/kind/$CLUSTER-config.yaml"
  {
    # Unquoted heredocs below: $VAR and $(...) expand on purpose, so a comment inside them must
    # not hold backticks (they would run as commands at every kind-up).
    cat <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  apiServerAddress: 127.0.0.1
  podSubnet: $POD_SUBNET
  disableDefaultCNI: $([[ $OFFLINE == 1 ]] && echo true || echo false)
kubeadmConfigPatches:
  # cgroup v1 hosts: kubelet >= 1.35 refuses them unless told otherwise. Logs: the kubelet
  # rotates a container's log at 10 MiB by default and "kubectl logs" shows only the current
  # file; 64 MiB keeps a test job's whole log readable.
  - |
    kind: KubeletConfiguration
    failCgroupV1: false
    containerLogMaxSize: 64Mi
YAML
    if [[ $OFFLINE == 1 ]]; then
      etcd_tag="$(docker image inspect -f '{{index .Config.Labels "dev.ddpjob.etcd-image-tag"}}' "$NODE_IMAGE")"
      cat <<YAML
  # the node image holds etcd under its real version (scripts/kind/node-image.sh)
  - |
    kind: ClusterConfiguration
    etcd:
      local:
        imageTag: "$etcd_tag"
  # a loaded 2-core machine: the node imports its images before the kubelet starts
  - |
    kind: InitConfiguration
    timeouts:
      controlPlaneComponentHealthCheck: 10m0s
      kubeletHealthCheck: 10m0s
      kubernetesAPICall: 5m0s
YAML
    fi
    echo "nodes:"
    for role in control-plane $(for _ in $(seq 1 "$WORKERS"); do echo worker; done); do
      cat <<YAML
  - role: $role
    extraMounts:
      - hostPath: $SHARED_DIR
        containerPath: $SHARED_DIR
YAML
      if [[ $role == worker ]] && ((${#stores[@]})); then
        cat <<YAML
      - hostPath: ${stores[0]}
        containerPath: /var/lib/containerd
YAML
        stores=("${stores[@]:1}")
      fi
    done
  } > "$config"
  stage "kind create cluster $CLUSTER (1 control-plane, $WORKERS workers)"
  "$KIND" create cluster --name "$CLUSTER" --config "$config" --kubeconfig "$KUBECONFIG_FILE" \
    ${NODE_IMAGE:+--image "$NODE_IMAGE"} --wait "$([[ $OFFLINE == 1 ]] && echo 0s || echo 300s)"
fi
"$KIND" get kubeconfig --name "$CLUSTER" > "$KUBECONFIG_FILE"
export KUBECONFIG="$KUBECONFIG_FILE"
if [[ $OFFLINE == 1 ]]; then
  stage "pod network (ptp CNI + routes)"
  bash "$KIND_SCRIPTS/cni.sh" "$CLUSTER" "$KUBECONFIG_FILE"
fi
kubectl wait --for=condition=Ready nodes --all --timeout=300s >/dev/null
kubectl -n kube-system rollout status deployment/coredns --timeout=300s >/dev/null
stage "nodes Ready: $(kubectl get nodes --no-headers | awk '{print $1}' | tr '\n' ' ')"

workers="$("$KIND" get nodes --name "$CLUSTER" | grep -v control-plane | paste -sd, -)"
stage "loading $TRAINER_IMAGE and $OPERATOR_IMAGE into $workers"
"$KIND" load docker-image --name "$CLUSTER" --nodes "$workers" "$OPERATOR_IMAGE" "$TRAINER_IMAGE"

stage "kubectl apply -k manifests/"
# Server-side: the CRD is too large for client-side apply's last-applied annotation.
kubectl apply --server-side --force-conflicts -k manifests/ >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
# A rebuilt image under the same tag needs a new pod to be used.
kubectl -n ddpjob-system rollout restart deployment/ddpjob-operator >/dev/null
kubectl -n ddpjob-system rollout status deployment/ddpjob-operator --timeout=300s >/dev/null
stage "operator Ready"
echo "export KUBECONFIG=$KUBECONFIG_FILE"
# No kubectl of the user's own: the README's next command needs the one of the cluster's version.
[[ -n "$user_kubectl" || -z "${BIN:-}" ]] || echo "export PATH=\"$BIN:\$PATH\""
