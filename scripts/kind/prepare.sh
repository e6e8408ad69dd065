#!/usr/bin/env bash
# Everything the kind tier needs before a cluster exists, each step cached (a second run only
# checks): the Docker engine, the Debian bases, the trainer's and the operator's wheels, the
# control-plane and kind binaries, the node image, the trainer/operator images and the plain
# Python image of the test-bed parity tests. `scripts/kind/up.sh` runs it first;
# `scripts/test.sh` runs it in the background, at the lowest CPU and I/O priority, while the
# other tiers run, so that a cold machine builds the kind path in their idle time (a cold build
# is ~25 min of mostly single-threaded or I/O-bound work; docs/testing.md has the figures).
#
# Order: the I/O-bound steps first (they overlap with setup's CPU-bound Go build), then the
# Go builds after the control plane's (`build-control-plane.sh` holds a lock, so this waits for
# the build setup started and then compiles only what kubelet/kubeadm/kube-proxy/kubectl add).
# Prints one `stage <seconds> <what>` line per step on stderr.
set -euo pipefail
LOG_TAG=kind/prepare
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
start=$SECONDS
stage() { log "[$((SECONDS - start)) s] $*"; }

use_docker
if registry_reachable; then
  stage "online: stock kind node image, python:3.11-slim base"
  bash scripts/images.sh
  image_exists python:3.11-slim || docker pull -q python:3.11-slim >/dev/null
else
  stage "Debian bases"
  bash "$KIND_SCRIPTS/debian-images.sh"
  stage "wheels and torch base"
  bash scripts/images.sh bases
  stage "control-plane binaries"
  bash scripts/build-control-plane.sh >/dev/null
  stage "kind binaries"
  bash "$KIND_SCRIPTS/build-binaries.sh" >/dev/null
  stage "node image"
  bash "$KIND_SCRIPTS/node-image.sh" >/dev/null
  stage "trainer and operator images"
  bash scripts/images.sh
  stage "python test image"
  image_exists "$LOCAL_PYTHON_TEST_IMAGE" || printf 'FROM %s\nRUN ln -s python3 /usr/bin/python\n' "$LOCAL_PYTHON_BASE" \
    | docker_build -q -t "$LOCAL_PYTHON_TEST_IMAGE" - >/dev/null
fi
stage "ready"
