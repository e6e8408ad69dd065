#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run). It installs what is missing, builds
# (once, cached) the control-plane binaries, then runs every test tier this machine can run:
#   1. unit, multi-process (real gloo ranks) and cluster (a real kube-apiserver/etcd/
#      controller-manager/scheduler started by the tests); gpu tests skip themselves where there
#      is no GPU. Extra arguments go to this pytest run.
#   2. kind: the same end-to-end suite against a kind cluster running the real trainer and
#      operator images (scripts/e2e-kind.sh), wherever a Docker engine can run.
# The kind tier runs beside tier 1 (scripts/kind/tier.sh, in the background): its builds
# (cold ~18 min: Debian bases, torch wheels, kind, the node image, the images) at the lowest CPU
# and I/O priority, then its suite as soon as they and this command's setup are done. Both
# suites mostly wait on pods and API servers, so they overlap; the kind tier's output is printed
# after tier 1's (docs/testing.md has the measured cold and warm figures).
#
# Env:
#   DDPJOB_TEST_KIND         auto (the default when no pytest arguments are given): the kind tier
#                            runs where Docker can run and is skipped, with the reason printed,
#                            where it cannot; 1: required (no Docker is a failure); 0: off (the
#                            default when pytest arguments select tests).
#   DDPJOB_KIND_START_BY_S   the kind suite starts only if its builds are done this many seconds
#                            after this command started (default 2700): a cold machine whose
#                            builds are slow prints "kind tier NOT RUN" and finds them cached (as
#                            far as they got) on its next run.
#   DDPJOB_TEST_LIMIT_S      the kind tier is stopped (a failure) at this many seconds (default
#                            5100 = 85 min, under CI's 90-minute limit).
#   DDPJOB_KIND_TIER_NEEDS_S the kind suite starts only if at least this many seconds are left
#                            before DDPJOB_TEST_LIMIT_S (default 1700): a late start prints "kind
#                            tier NOT RUN" instead of being cut off half-way (a failure that
#                            says nothing about the code).
#   DDPJOB_TEST_LANES        2 (the default without pytest arguments): tier 1 in two lanes, each
#                            on its own test bed (scripts/tier1-lane2.txt); 1: one lane.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/kind/lib.sh
LOG_TAG=test
start=$SECONDS
start_by="${DDPJOB_KIND_START_BY_S:-2700}"
limit="${DDPJOB_TEST_LIMIT_S:-5100}"
kind_needs="${DDPJOB_KIND_TIER_NEEDS_S:-1700}"
if (($#)); then kind_mode="${DDPJOB_TEST_KIND:-0}"; else kind_mode="${DDPJOB_TEST_KIND:-auto}"; fi
timings=()
timed() {  # timed <label> <command...>: runs it, records its duration
  local t0=$SECONDS rc=0
  "${@:2}" || rc=$?
  timings+=("$(printf '%-34s %5d s  (rc %d)' "$1" $((SECONDS - t0)) "$rc")")
  return $rc
}
report() {
  log "timings:"
  local line; for line in "${timings[@]}"; do log "  $line"; done
  log "  $(printf '%-34s %5d s' total $((SECONDS - start)))"
}

# --- the kind tier, in the background ----------------------------------------------------------
kind_skip_reason=""
kind_pid=""
peer_builds_dir="$(mktemp -d)"  # tier 1's background Go builds: their pids, logs and outputs
kind_dir="$(mktemp -d)"         # the kind tier's output, its timings, and the go of this setup
case "$kind_mode" in
  0) kind_skip_reason="DDPJOB_TEST_KIND=0" ;;
  1|auto) kind_skip_reason="$(docker_unavailable_reason)" ;;
  *) die "DDPJOB_TEST_KIND must be auto, 1 or 0, not '$kind_mode'" ;;
esac
if [[ -z "$kind_skip_reason" ]]; then
  log "kind tier: its builds start now and its suite beside tier 1 (output after tier 1's)"
  DDPJOB_TEST_STARTED_AT="$(($(date +%s) - (SECONDS - start)))" DDPJOB_KIND_START_BY_S="$start_by" \
    DDPJOB_TEST_LIMIT_S="$limit" DDPJOB_KIND_TIER_NEEDS_S="$kind_needs" \
    DDPJOB_KIND_TIMINGS="$kind_dir/timings" DDPJOB_KIND_SETUP_DONE="$kind_dir/setup-done" \
    setsid bash scripts/kind/tier.sh >"$kind_dir/output" 2>&1 &
  kind_pid=$!
fi
stop_kind_tier() {
  if [[ -n "$kind_pid" ]] && kill -0 "$kind_pid" 2>/dev/null; then
    kill -TERM "$kind_pid" 2>/dev/null || true
    wait "$kind_pid" 2>/dev/null || true
  fi
}
lane2_pid=""
on_exit() {
  local rc=$?
  [[ -n "$lane2_pid" ]] && kill -TERM "$lane2_pid" 2>/dev/null && wait "$lane2_pid" 2>/dev/null
  stop_kind_tier
  rm -rf "$peer_builds_dir" "$kind_dir" "${lane2_dir:-}"
  # The kind tier may have started the project's dockerd; leave the machine as it was.
  [[ -n "$kind_pid" ]] && bash scripts/kind/dockerd.sh stop >/dev/null 2>&1 || true
  exit $rc
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- tier 1 ------------------------------------------------------------------------------------
# Tier 1's Go builds from the module proxy, cached: the control plane, and the peers it starts
# next to it (Kueue for the queue tests, Kubeflow's training-operator for the side-by-side smoke
# test). They need only Go, so they start now and overlap with setup's pip downloads (a cold
# machine: 13 min of control-plane build after 8 min of setup, measured, when they ran one after
# the other); waited for before pytest.
for build in control-plane kueue training-operator; do
  bash "scripts/build-$build.sh" >"$peer_builds_dir/$build.dir" 2>"$peer_builds_dir/$build.log" &
  echo $! >"$peer_builds_dir/$build.pid"
done
timed setup bash scripts/setup.sh
timed "test dependencies" bash scripts/install-test-deps.sh
peer_build() {  # peer_build <name> <env var>: waits for the build; its folder into the variable
  local rc=0
  wait "$(cat "$peer_builds_dir/$1.pid")" || rc=$?
  if ((rc != 0)); then
    tail -n 30 "$peer_builds_dir/$1.log" >&2
    log "ERROR: scripts/build-$1.sh failed (rc $rc)"
    return $rc
  fi
  export "$2=$(cat "$peer_builds_dir/$1.dir")"
}
timed "control-plane build (background)" peer_build control-plane DDPJOB_CONTROL_PLANE_DIR
timed "Kueue build (background)" peer_build kueue DDPJOB_KUEUE_DIR
timed "training-operator build (background)" peer_build training-operator DDPJOB_TRAINING_OPERATOR_DIR
# The checkout under test, also in every process the tests start (operator, node agent, CLI),
# whatever else an editable install on this machine points at.
export PYTHONPATH="$PWD/operator:$PWD/trainer:$PWD${PYTHONPATH:+:$PYTHONPATH}"
touch "$kind_dir/setup-done"  # the kind suite may start: the project and its test tools are in
rc=0
# pytest exits 5 when no test was collected: that is a failure of this command, not a pass.
# Tier 1 runs in two lanes (below) unless DDPJOB_TEST_LANES=1 or pytest arguments are given.
if (($#)) || [[ "${DDPJOB_TEST_LANES:-2}" != 2 ]]; then
  timed "pytest (unit, multiprocess, cluster)" python3 -m pytest -ra --durations=15 "$@" || rc=$?
else
  # Tier 1 in two lanes at once, each with its own test bed (control plane, node agent, pod
  # bridge and CIDR: tests/testbed/testbed.py): the cluster tests mostly wait on pods and API
  # servers, one at a time on one test bed, so splitting them is what shortens tier 1
  # (docs/testing.md has the figures). Lane 2 runs the cluster files of scripts/tier1-lane2.txt
  # (the slow end-to-end ones, balanced by measured durations); lane 1 everything else, so a new
  # test file runs in lane 1 until it is listed. Lane 2's output follows lane 1's.
  mapfile -t lane2 < <(grep -v '^[[:space:]]*\(#\|$\)' scripts/tier1-lane2.txt)
  lane2_dir="$(mktemp -d)"
  (
    t0=$SECONDS lane_rc=0
    # Its own pytest temporary root too: pytest prunes the old numbered folders of its root,
    # which may be the other lane's, in use.
    DDPJOB_TESTBED_DIR=/tmp/ddpjob-testbed-lane2 DDPJOB_TESTBED_BRIDGE=ddpjob2 \
      DDPJOB_TESTBED_POD_CIDR=10.246.0.0/16 PYTEST_DEBUG_TEMPROOT="$lane2_dir" \
      python3 -m pytest -ra --durations=15 "${lane2[@]}" || lane_rc=$?
    echo "$((SECONDS - t0)) $lane_rc" >"$lane2_dir/took"
    exit $lane_rc
  ) >"$lane2_dir/output" 2>&1 &
  lane2_pid=$!
  ignores=(); for file in "${lane2[@]}"; do ignores+=("--ignore=$file"); done
  timed "pytest lane 1 (unit, multiprocess, cluster)" python3 -m pytest -ra --durations=15 "${ignores[@]}" || rc=$?
  lane2_rc=0
  wait "$lane2_pid" || lane2_rc=$?
  lane2_pid=""
  read -r lane2_took _ <"$lane2_dir/took" 2>/dev/null || lane2_took=-1
  timings+=("$(printf '%-34s %5d s  (rc %d)' "pytest lane 2 (cluster, beside)" "$lane2_took" "$lane2_rc")")
  log "tier 1, lane 2 (${lane2[*]}):"
  cat "$lane2_dir/output" >&2
  rm -rf "$lane2_dir"
  ((rc == 0)) && rc=$lane2_rc
fi

# --- tier 2: kind (running since the start) -----------------------------------------------------
kind_rc=0
if [[ -n "$kind_skip_reason" ]]; then
  if [[ "$kind_mode" == 1 ]]; then
    log "ERROR: DDPJOB_TEST_KIND=1 but the kind tier cannot run: $kind_skip_reason"
    kind_rc=1
  else
    log "kind tier SKIPPED: $kind_skip_reason"
  fi
else
  log "waiting for the kind tier (scripts/kind/tier.sh; its output follows)"
  t0=$SECONDS
  wait "$kind_pid" || kind_rc=$?
  kind_pid=""
  timings+=("$(printf '%-34s %5d s  (rc %d)' "kind tier: waited after tier 1" $((SECONDS - t0)) "$kind_rc")")
  cat "$kind_dir/output" >&2
  [[ -f "$kind_dir/timings" ]] && mapfile -t -O "${#timings[@]}" timings <"$kind_dir/timings"
fi
report
((rc == 0)) && rc=$kind_rc
exit $rc
