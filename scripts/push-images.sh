#!/usr/bin/env bash
# `make push REGISTRY=registry.example.com/team`: tag the images `make images` built
# (localhost/ddpjob/trainer:VERSION, localhost/ddpjob/operator:VERSION) under your registry and push
# them, so a real cluster's nodes can pull them; then say how the operator and `ddpjob submit`
# use them. The localhost/ names exist in no registry: a cluster's pods wait in ImagePullBackOff,
# which the DDPJob's status names (reason ImageNotPulled).
# Needs `docker` logged in to REGISTRY (docker login). DOCKER names another client (podman).
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKER="${DOCKER:-docker}"
REGISTRY="${REGISTRY:-}"
REGISTRY="${REGISTRY%/}"
VERSION="$(sed -n 's/^__version__ = "\(.*\)"/\1/p' operator/ddpjob/__init__.py)"
TRAINER_IMAGE="${DDPJOB_TRAINER_IMAGE:-localhost/ddpjob/trainer:$VERSION}"
OPERATOR_IMAGE="${DDPJOB_OPERATOR_IMAGE:-localhost/ddpjob/operator:$VERSION}"

die() { echo "push-images: error: $*" >&2; exit 2; }
[[ -n "$REGISTRY" ]] || die "REGISTRY is not set: make push REGISTRY=registry.example.com/team (a registry your nodes pull from)"
[[ "$REGISTRY" =~ ^[A-Za-z0-9][A-Za-z0-9._:/-]*$ ]] || die "REGISTRY=$REGISTRY: expected host[:port][/path], e.g. registry.example.com/team"
[[ "$REGISTRY" == localhost* ]] && die "REGISTRY=$REGISTRY: localhost is each node's own; name a registry the nodes reach"
command -v "$DOCKER" >/dev/null || die "$DOCKER not found (set DOCKER to your client, e.g. DOCKER=podman)"

pushed=()
for local_image in "$TRAINER_IMAGE" "$OPERATOR_IMAGE"; do
  "$DOCKER" image inspect "$local_image" >/dev/null 2>&1 \
    || die "$local_image is not built here: run make images first"
  remote="$REGISTRY/${local_image#localhost/}"
  "$DOCKER" tag "$local_image" "$remote"
  "$DOCKER" push "$remote" || die "pushing $remote failed (docker login ${REGISTRY%%/*}?)"
  pushed+=("$remote")
done

cat <<DONE
pushed ${pushed[0]} and ${pushed[1]}. To use them:
  export DDPJOB_IMAGE=${pushed[0]}     # or image: in ~/.config/ddpjob/config.yaml, or --image
  kubectl -n ddpjob-system set image deployment/ddpjob-operator operator=${pushed[1]}
  in your DDPJobs: spec.image: ${pushed[0]}
DONE
