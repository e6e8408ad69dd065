#!/bin/bash
# Imports the images baked into the node image into containerd's k8s.io namespace, once per
# node (/var is the node's own volume): /kind/images/common/*.tar on every node (pause,
# kube-proxy, CoreDNS), /kind/images/control-plane/*.tar only on control-plane nodes (kind names
# them <cluster>-control-plane[N]; workers never run these). Runs before the kubelet: kubeadm's
# static pods and kube-proxy then find their images without a registry.
set -euo pipefail
marker=/var/lib/ddpjob-preloaded
[[ -f "$marker" ]] && exit 0
for _ in $(seq 1 60); do ctr version >/dev/null 2>&1 && break; sleep 0.5; done
dirs=(/kind/images/common)
[[ "$(hostname)" == *control-plane* ]] && dirs+=(/kind/images/control-plane)
for dir in "${dirs[@]}"; do
  for image in "$dir"/*.tar; do
    ctr --namespace=k8s.io images import --snapshotter=overlayfs "$image"
  done
done
touch "$marker"
