# Sourced by scripts/kind/*.sh: logging, the project's Docker engine, and whether a public
# registry can be reached (then the stock images are used: python:3.11-slim, kindest/node).
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
KIND_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$KIND_SCRIPTS/../.." && pwd)"
log() { printf '[%s] %s\n' "${LOG_TAG:-kind}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The image names the project builds (README.md, examples/ and manifests/ use these).
TRAINER_IMAGE="${DDPJOB_TRAINER_IMAGE:-localhost/ddpjob/trainer:0.1.0}"
OPERATOR_IMAGE="${DDPJOB_OPERATOR_IMAGE:-localhost/ddpjob/operator:0.1.0}"
# Bases built from Debian packages where no registry can be reached (scripts/kind/debian-images.sh).
LOCAL_PYTHON_BASE="localhost/ddpjob/python-base:$DEBIAN_SUITE"
LOCAL_NODE_IMAGE="localhost/ddpjob/kind-node:$K8S_VERSION"
# The test-bed parity tests (tests/cluster/test_testbed.py) run pods on a plain Python image with
# no entrypoint that runs as root, as python:3.11-slim does: offline, the Debian base plus `python`.
LOCAL_PYTHON_TEST_IMAGE="localhost/ddpjob/python:3.11-$DEBIAN_SUITE"

# apt-get install that waits for another apt-get (scripts/test.sh runs this path's setup next to
# scripts/install-test-deps.sh) and refreshes the package lists once if a package is unknown.
apt_install() {
  command -v apt-get >/dev/null || die "$* missing and no apt-get to install them"
  log "installing $* with apt-get"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 -y -qq)
  "${apt[@]}" install "$@" >/dev/null 2>&1 || { "${apt[@]}" update >/dev/null; "${apt[@]}" install "$@" >/dev/null; }
}

# Why the kind tier cannot run on this machine (empty when it can): a Docker engine answers,
# or this user can start the project's own (root, and dockerd installed or installable).
docker_unavailable_reason() {
  if [[ -n "${DOCKER_HOST:-}" ]] || { [[ -S /var/run/docker.sock ]] && docker info >/dev/null 2>&1; }; then
    return 0
  fi
  if [[ $EUID -ne 0 ]]; then echo "no Docker engine answers and starting one needs root"
  elif ! command -v dockerd >/dev/null && ! command -v apt-get >/dev/null; then
    echo "no Docker engine, no dockerd and no apt-get to install one"
  elif ! grep -qw overlay /proc/filesystems && ! modprobe -n overlay 2>/dev/null; then
    echo "the kernel has no overlay filesystem for Docker's overlay2 storage"
  fi
}

# Docker: the engine in DOCKER_HOST, or the project's own (scripts/kind/dockerd.sh).
use_docker() {
  bash "$KIND_SCRIPTS/dockerd.sh" start
  eval "$(bash "$KIND_SCRIPTS/dockerd.sh" env)"
  export DOCKER_HOST
}

# Whether public images can be pulled: DDPJOB_OFFLINE=1/0 decides; otherwise Docker Hub is
# probed once (an HTTP answer, 401 included, means reachable).
registry_reachable() {
  case "${DDPJOB_OFFLINE:-}" in 1) return 1 ;; 0) return 0 ;; esac
  local code
  code="$(curl -s -o /dev/null -m 5 -w '%{http_code}' https://registry-1.docker.io/v2/ 2>/dev/null || true)"
  [[ "$code" =~ ^[1-5][0-9][0-9]$ && "$code" != 000 ]]
}

# `docker build` with the classic builder: BuildKit's Dockerfile frontend would be pulled from
# a registry, and the CLI may lack the buildx plugin.
docker_build() { DOCKER_BUILDKIT=0 docker build --force-rm "$@"; }

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# Images this project built and then replaced under the same name (now untagged): their space
# back. Only dangling images with the project's label or its build-stage label.
prune_replaced() {
  docker image prune -f --filter label=dev.ddpjob.key >/dev/null
  docker image prune -f --filter label=dev.ddpjob.build-stage=1 >/dev/null
}
