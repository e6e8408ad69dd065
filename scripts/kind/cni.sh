#!/usr/bin/env bash
# Pod networking for a kind cluster created with disableDefaultCNI (offline: kind's kindnetd
# does not build from the Go module proxy alone). Each node gets a ptp + host-local CNI config
# for its podCIDR (the CNI plugins are Debian's, in the node image) and a route to every other
# node's podCIDR via that node's address on the docker network. Idempotent; rerun after a node
# container restarts (routes do not survive it).
# Usage: cni.sh CLUSTER_NAME KUBECONFIG
set -euo pipefail
LOG_TAG=kind/cni
source "$(dirname "$0")/lib.sh"
CLUSTER="$1" KUBECONFIG_FILE="$2"
KIND="${KIND:-kind}"
mapfile -t nodes < <("$KIND" get nodes --name "$CLUSTER")
declare -A cidr ip
for node in "${nodes[@]}"; do
  for _ in $(seq 1 60); do
    cidr[$node]="$(kubectl --kubeconfig "$KUBECONFIG_FILE" get node "$node" -o 'jsonpath={.spec.podCIDR}' 2>/dev/null || true)"
    [[ -n "${cidr[$node]}" ]] && break
    sleep 1
  done
  [[ -n "${cidr[$node]}" ]] || die "node $node got no podCIDR (is the controller-manager allocating them?)"
  ip[$node]="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$node")"
done
for node in "${nodes[@]}"; do
  docker exec -i "$node" sh -c 'mkdir -p /etc/cni/net.d && cat > /etc/cni/net.d/10-ddpjob-ptp.conflist' <<JSON
{
  "cniVersion": "0.4.0",
  "name": "ddpjob-ptp",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": 1500,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "${cidr[$node]}"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  for other in "${nodes[@]}"; do
    [[ "$other" == "$node" ]] && continue
    docker exec "$node" ip route replace "${cidr[$other]}" via "${ip[$other]}"
  done
  log "$node: pods ${cidr[$node]}, node ${ip[$node]}"
done
