#!/usr/bin/env bash
# The project's own Docker engine: start | stop | status | env.
# A private dockerd (own socket, data-root and exec-root under ~/.cache/ddpjob/docker and
# /run/ddpjob-docker) so that nothing of the machine's own Docker setup, if any, is touched
# and images survive between runs. Started with --iptables=false --ip-forward=false: a dockerd
# that manages iptables sets the FORWARD policy to DROP, which cuts off every other bridge on
# the machine (the control-plane test bed's among them); kind needs no NAT here (no registry
# is pulled from, the API server is reached through docker-proxy on 127.0.0.1).
# Its default runtime is runc-wrapper.py (why: see there).
# `eval "$(scripts/kind/dockerd.sh env)"` sets DOCKER_HOST for the shell.
# If DOCKER_HOST is set by the user, or the default socket answers and DDPJOB_OWN_DOCKERD is not
# 1, that engine is used and start/stop do nothing (a laptop with Docker Desktop).
set -euo pipefail
source "$(dirname "$0")/versions.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
DOCKER_DIR="$DDPJOB_CACHE/docker"
EXEC_ROOT=/run/ddpjob-docker
SOCKET="$EXEC_ROOT/docker.sock"
PIDFILE="$EXEC_ROOT/dockerd.pid"
BRIDGE_CIDR="${DDPJOB_DOCKER_BRIDGE_CIDR:-172.28.0.1/24}"
log() { printf '[kind/dockerd] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

use_external() {
  [[ "${DDPJOB_OWN_DOCKERD:-}" == 1 ]] && return 1
  [[ -n "${DOCKER_HOST:-}" && "${DOCKER_HOST}" != "unix://$SOCKET" ]] && return 0
  [[ -S /var/run/docker.sock ]] && DOCKER_HOST= docker info >/dev/null 2>&1
}

running() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && DOCKER_HOST="unix://$SOCKET" docker info >/dev/null 2>&1; }

start() {
  if use_external; then log "using the Docker engine at ${DOCKER_HOST:-/var/run/docker.sock}"; return 0; fi
  if running; then return 0; fi
  if ! command -v dockerd >/dev/null; then
    (LOG_TAG=kind/dockerd; source "$HERE/lib.sh"; apt_install docker.io)  # dockerd, containerd, runc
  fi
  mkdir -p "$DOCKER_DIR/data" "$EXEC_ROOT"
  local runtime_args=()
  if [[ -x /usr/sbin/runc || -x /usr/bin/runc ]]; then
    runtime_args=(--add-runtime "ddpjob-runc=$HERE/runc-wrapper.py" --default-runtime ddpjob-runc)
    export DDPJOB_REAL_RUNC="$(command -v runc || echo /usr/sbin/runc)"
  fi
  log "starting dockerd (data-root $DOCKER_DIR/data, socket $SOCKET)"
  # setsid + nohup: the engine outlives this script; `stop` ends it by its pid file.
  setsid nohup dockerd --data-root "$DOCKER_DIR/data" --exec-root "$EXEC_ROOT" \
    --pidfile "$PIDFILE" --host "unix://$SOCKET" --iptables=false --ip-forward=false \
    --ip-masq=false --bip "$BRIDGE_CIDR" --storage-driver overlay2 "${runtime_args[@]}" \
    >"$DOCKER_DIR/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 1 120); do
    running && { log "dockerd is up"; return 0; }
    sleep 0.5
  done
  tail -20 "$DOCKER_DIR/dockerd.log" >&2
  die "dockerd did not answer within 60 s (log: $DOCKER_DIR/dockerd.log)"
}

stop() {
  use_external && return 0
  [[ -f "$PIDFILE" ]] || return 0
  local pid; pid="$(cat "$PIDFILE")"
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$PIDFILE"
  # The default bridge dockerd made (ours by its address) goes too: the machine as it was.
  if ip -4 addr show docker0 2>/dev/null | grep -q " ${BRIDGE_CIDR%/*}/"; then
    ip link delete docker0 2>/dev/null || true
  fi
  # dockerd's containerd and shims end with it; what they mounted under the exec-root goes too.
  grep -o " $EXEC_ROOT[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  grep -q " $EXEC_ROOT" /proc/mounts || rm -rf "$EXEC_ROOT"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if use_external || running; then echo running; else echo stopped; exit 1; fi ;;
  env) if use_external; then echo "export DOCKER_HOST=${DOCKER_HOST:-unix:///var/run/docker.sock}"; else echo "export DOCKER_HOST=unix://$SOCKET"; fi ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
