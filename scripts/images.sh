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
# in a context assembled under ~/.cache/ddpjob/images/, so the build itself needs no network:
# torch goes into a base image of its own (images/torch-base, rebuilt only when the wheels
# change), which trainer/Dockerfile builds on with OFFLINE=1.
# Usage: images.sh [trainer|operator|bases]...   (default: trainer and operator; `bases`: only
# the wheels and, offline, the torch base: what changes least, for scripts/kind/prepare.sh). Uses the project's dockerd if no
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

# What an image installs: pyproject.toml's dependencies plus one extra (trainer, operator), read
# from the file, so that a dependency added there is in the offline wheel folder too.
requirements_of() {  # requirements_of EXTRA -> one requirement a line
  python3 -c 'import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project.get("dependencies", []) + project["optional-dependencies"][sys.argv[1]]))' "$1"
}

make_context() {  # make_context NAME SKIP_REGEX -> a folder: the repository's files + wheels/
  local name="$1" skip="$2" ctx="$CONTEXTS/context-$1"
  rm -rf "$ctx"; mkdir -p "$ctx/wheels"
  # The repository's files as git sees them (tracked and new, not ignored).
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$ctx"
  link_wheels "$name" "$skip" "$ctx/wheels"
  echo "$ctx"
}

link_wheels() {  # link_wheels NAME SKIP_REGEX DEST
  local whl
  for whl in "$WHEELS/$1"/*.whl; do
    [[ "$(basename "$whl")" =~ $2 ]] && continue
    ln "$whl" "$3/" 2>/dev/null || cp "$whl" "$3/"
  done
}

# What an image is built from: the files its Dockerfile copies, the Dockerfile, the pins.
source_key() {  # source_key DOCKERFILE EXTRA...
  { git ls-files -co --exclude-standard -z pyproject.toml README.md ci/constraints.txt operator trainer "$1" \
      | xargs -0 sha256sum; echo "${*:2}"; } | sha256sum | cut -c1-16
}

up_to_date() { [[ "$(docker image inspect -f '{{index .Config.Labels "dev.ddpjob.key"}}' "$1" 2>/dev/null)" == "$2" ]]; }
drop_build_stages() { prune_replaced; }
report() { log "$1: $(docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1/1e9}') in $2 s"; }

# Offline: Python + torch from the wheels, once per set of wheels (images/torch-base).
torch_base() {
  mapfile -t reqs < <(requirements_of trainer)
  download_wheels trainer "${reqs[@]}"
  local key; key="$( (ls "$WHEELS/trainer" | grep -Ev "$TRAINER_SKIP"; cat images/torch-base/Dockerfile
                      docker image inspect -f '{{.Id}}' "$LOCAL_PYTHON_BASE") | sha256sum | cut -c1-12)"
  TORCH_BASE="localhost/ddpjob/torch-base:$key"
  image_exists "$TORCH_BASE" && return 0
  local ctx="$CONTEXTS/context-torch-base" start=$SECONDS
  rm -rf "$ctx"; mkdir -p "$ctx"
  link_wheels trainer "$TRAINER_SKIP" "$ctx"
  cp images/torch-base/Dockerfile "$ctx/"
  log "docker build $TORCH_BASE ($(du -shL "$ctx" | cut -f1) of wheels)"
  docker_build -q --build-arg "BASE=$LOCAL_PYTHON_BASE" -t "$TORCH_BASE" "$ctx" >/dev/null
  rm -rf "$ctx"; drop_build_stages
  report "$TORCH_BASE" $((SECONDS - start))
}

build_trainer() {
  local tag="$TRAINER_IMAGE" start=$SECONDS key
  if registry_reachable; then
    key="$(source_key trainer/Dockerfile online)"
    up_to_date "$tag" "$key" && { log "$tag is up to date"; return 0; }
    log "docker build $tag (python:3.11-slim, torch from PyTorch's CPU index)"
    docker_build -q --label "dev.ddpjob.key=$key" -f trainer/Dockerfile -t "$tag" . >/dev/null
  else
    bash "$KIND_SCRIPTS/debian-images.sh" python
    torch_base
    key="$(source_key trainer/Dockerfile "$TORCH_BASE")"
    up_to_date "$tag" "$key" && { log "$tag is up to date"; return 0; }
    log "docker build $tag (offline: base $TORCH_BASE)"
    docker_build -q --build-arg "BASE=$TORCH_BASE" --build-arg OFFLINE=1 \
      --label "dev.ddpjob.key=$key" -f trainer/Dockerfile -t "$tag" . >/dev/null
  fi
  prune_replaced
  report "$tag" $((SECONDS - start))
}

build_operator() {
  local tag="$OPERATOR_IMAGE" start=$SECONDS key
  if registry_reachable; then
    key="$(source_key manifests/operator.Dockerfile online)"
    up_to_date "$tag" "$key" && { log "$tag is up to date"; return 0; }
    log "docker build $tag (python:3.11-slim, packages from PyPI)"
    docker_build -q --label "dev.ddpjob.key=$key" -f manifests/operator.Dockerfile -t "$tag" . >/dev/null
  else
    bash "$KIND_SCRIPTS/debian-images.sh" python
    mapfile -t reqs < <(requirements_of operator)
    download_wheels operator "${reqs[@]}"
    key="$(source_key manifests/operator.Dockerfile "$(docker image inspect -f '{{.Id}}' "$LOCAL_PYTHON_BASE")" "$(ls "$WHEELS/operator")")"
    up_to_date "$tag" "$key" && { log "$tag is up to date"; return 0; }
    local ctx; ctx="$(make_context operator '^$')"
    log "docker build $tag (offline: base $LOCAL_PYTHON_BASE, wheels from $WHEELS/operator)"
    docker_build -q --build-arg "BASE=$LOCAL_PYTHON_BASE" --label "dev.ddpjob.key=$key" \
      -f "$ctx/manifests/operator.Dockerfile" -t "$tag" "$ctx" >/dev/null
    rm -rf "$ctx"; drop_build_stages
  fi
  report "$tag" $((SECONDS - start))
}

targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=(operator trainer)
for t in "${targets[@]}"; do
  case "$t" in
    trainer) build_trainer ;;
    operator) build_operator ;;
    bases) registry_reachable || { bash "$KIND_SCRIPTS/debian-images.sh" python; torch_base
                                   mapfile -t reqs < <(requirements_of operator)
                                   download_wheels operator "${reqs[@]}"; } ;;
    *) die "unknown image $t (trainer, operator, bases)" ;;
  esac
done
