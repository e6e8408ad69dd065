#!/usr/bin/env bash
# `make images`: the trainer (CPU) and operator images from trainer/Dockerfile and
# manifests/operator.Dockerfile, tagged as examples/ and manifests/ name them
# (localhost/ddpjob/trainer:0.1.0, localhost/ddpjob/operator:0.1.0; override with
# DDPJOB_TRAINER_IMAGE / DDPJOB_OPERATOR_IMAGE). No registry hosts these: push them to yours,
# or `kind load docker-image` them (README.md).
#
# Where a public registry is reachable: a plain `docker build` of the repository (python:3.11-slim,
# torch from PyTorch's CPU index). Where none is (DDPJOB_OFFLINE=1, or auto-detected): the base is
# the project's own Debian image (scripts/kind/debian-images.sh) and the Python packages come
# from wheels that pip downloads on the host into ~/.cache/ddpjob/wheels/, handed to the build
# in a context assembled under ~/.cache/ddpjob/images/ (the repository's files + wheels/), so
# the build itself needs no network.
# Usage: images.sh [trainer|operator]...   (default: both). Uses the project's dockerd if no
# other engine is set up (scripts/kind/dockerd.sh).
set -euo pipefail
LOG_TAG=images
source "$(dirname "$0")/kind/lib.sh"
cd "$REPO_ROOT"
use_docker
WHEELS="$DDPJOB_CACHE/wheels"
CONTEXTS="$DDPJOB_CACHE/images"

# The trainer's wheels, minus what a CPU trainer never loads: triton (torch.compile's GPU code
# generator, 0.9 GB installed) and the cuda-python bindings. PyPI's x86-64 torch is the CUDA
# build and its libraries link every other CUDA library (cuBLAS, cuDNN, NCCL, cuSOLVER, CUPTI...:
# `readelf -d torch/lib/*.so`), so those stay: without a PyTorch CPU index, that is as small as
# torch allows.
TRAINER_SKIP='^(triton|cuda_bindings|cuda_pathfinder|cuda_toolkit)-'

download_wheels() {  # download_wheels NAME REQUIREMENT...
  local dir="$WHEELS/$1"; shift
  local key; key="$(echo "$* $(cat ci/constraints.txt)" | sha256sum | cut -c1-12)"
  [[ -f "$dir/.key" && "$(cat "$dir/.key")" == "$key" ]] && return 0
  log "pip download $* -> $dir"
  rm -rf "$dir"; mkdir -p "$dir"
  python3 -m pip download -q --only-binary=:all: -d "$dir" -c ci/constraints.txt "$@" setuptools wheel \
    || die "pip download failed"
  echo "$key" > "$dir/.key"
}

make_context() {  # make_context NAME SKIP_REGEX -> prints the folder
  local name="$1" skip="$2" ctx="$CONTEXTS/context-$1"
  rm -rf "$ctx"; mkdir -p "$ctx/wheels"
  # The repository's files as git sees them (tracked and new, not ignored).
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$ctx"
  local whl
  for whl in "$WHEELS/$name"/*.whl; do
    [[ "$(basename "$whl")" =~ $skip ]] && continue
    ln "$whl" "$ctx/wheels/" 2>/dev/null || cp "$whl" "$ctx/wheels/"
  done
  echo "$ctx"
}

# What an image is built from: the files its Dockerfile copies, the Dockerfile, the pins.
source_key() {  # source_key DOCKERFILE EXTRA...
  { git ls-files -co --exclude-standard -z pyproject.toml README.md ci/constraints.txt operator trainer "$1" \
      | xargs -0 sha256sum; echo "${*:2}"; } | sha256sum | cut -c1-16
}

build_image() {  # build_image NAME DOCKERFILE TAG
  local name="$1" dockerfile="$2" tag="$3" start=$SECONDS online=0
  registry_reachable && online=1
  [[ $online == 1 ]] || bash "$KIND_SCRIPTS/debian-images.sh" python
  local key; key="$(source_key "$dockerfile" "online=$online" "$TRAINER_SKIP" "$(docker image inspect -f "{{.Id}}" "$LOCAL_PYTHON_BASE" 2>/dev/null)")"
  if [[ "$(docker image inspect -f '{{index .Config.Labels "dev.ddpjob.key"}}' "$tag" 2>/dev/null)" == "$key" ]]; then
    log "$tag is up to date"; return 0
  fi
  if [[ $online == 1 ]]; then
    log "docker build $tag (public base, packages from the indexes)"
    docker_build -q --label "dev.ddpjob.key=$key" -f "$dockerfile" -t "$tag" . >/dev/null
  else
    local ctx skip='^$'
    [[ "$name" == trainer ]] && skip="$TRAINER_SKIP"
    if [[ "$name" == trainer ]]; then download_wheels trainer torch torchvision PyYAML
    else download_wheels operator kopf kubernetes PyYAML; fi
    ctx="$(make_context "$name" "$skip")"
    log "docker build $tag (offline: base $LOCAL_PYTHON_BASE, $(du -shL "$ctx/wheels" | cut -f1) of wheels)"
    docker_build -q --build-arg "BASE=$LOCAL_PYTHON_BASE" --label "dev.ddpjob.key=$key" -f "$ctx/$dockerfile" -t "$tag" "$ctx" >/dev/null
    rm -rf "$ctx"
  fi
  log "$tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}') in $((SECONDS - start)) s"
}

targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=(operator trainer)
for t in "${targets[@]}"; do
  case "$t" in
    trainer) build_image trainer trainer/Dockerfile "$TRAINER_IMAGE" ;;
    operator) build_image operator manifests/operator.Dockerfile "$OPERATOR_IMAGE" ;;
    *) die "unknown image $t (trainer, operator)" ;;
  esac
done
