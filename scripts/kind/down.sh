#!/usr/bin/env bash
# `make kind-down`: deletes the kind cluster, the network and the shared folder `make kind-up`
# made, and stops the project's dockerd, leaving the machine as it was. Caches stay
# (~/.cache/ddpjob: binaries, images in the dockerd data-root, and the workers' containerd
# stores, Docker volumes ddpjob-kind-containerd-*: see up.sh).
set -euo pipefail
LOG_TAG=kind/down
source "$(dirname "$0")/lib.sh"
CLUSTER="${KIND_CLUSTER_NAME:-ddpjob}"
if [[ "$(bash "$KIND_SCRIPTS/dockerd.sh" status 2>/dev/null)" == running ]]; then
  eval "$(bash "$KIND_SCRIPTS/dockerd.sh" env)"; export DOCKER_HOST
  KIND="$(command -v kind || true)"
  [[ -x "$KIND_BIN_DIR/kind" ]] && KIND="$KIND_BIN_DIR/kind"
  if [[ -n "$KIND" ]] && "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "kind delete cluster $CLUSTER"
    "$KIND" delete cluster --name "$CLUSTER" --kubeconfig "$DDPJOB_CACHE/kind/$CLUSTER.kubeconfig"
  fi
  # The network this project created (only when nothing else is attached to it).
  if [[ "$DOCKER_HOST" == unix:///run/ddpjob-docker/* ]] && docker network inspect kind >/dev/null 2>&1 \
     && [[ "$(docker network inspect -f '{{len .Containers}}' kind)" == 0 ]]; then
    docker network rm kind >/dev/null
  fi
fi
rm -rf "$DDPJOB_CACHE/kind/shared-$CLUSTER" "$DDPJOB_CACHE/kind/$CLUSTER.kubeconfig"
bash "$KIND_SCRIPTS/dockerd.sh" stop
log "done"
