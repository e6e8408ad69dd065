#!/usr/bin/env bash
# The kind tier of scripts/test.sh, run by it in the background beside tier 1: the tier's builds
# (prepare.sh, at the lowest CPU and I/O priority), then, if they are done in time,
# scripts/e2e-kind.sh (required, bounded). Both suites spend most of their time waiting on pods
# and API servers (the CPU stays 70-90% idle during the kind suite, measured), so they overlap
# rather than queue: the run lasts about as long as the longer one.
#
# Env (set by scripts/test.sh; docs/testing.md has the meaning of each):
#   DDPJOB_TEST_STARTED_AT   epoch seconds at which scripts/test.sh started
#   DDPJOB_KIND_START_BY_S   the suite starts only if the builds are done this many seconds after it
#   DDPJOB_TEST_LIMIT_S      the suite is stopped (a failure) at this many seconds after it
#   DDPJOB_KIND_TIER_NEEDS_S the suite starts only if this many seconds are left before the limit
#   DDPJOB_KIND_TIMINGS      a file: one line per step and its duration, for test.sh's report
#   DDPJOB_KIND_SETUP_DONE   a file test.sh makes once its setup is done: the suite waits for it
# Exit status: the suite's, 1 for a failed build, 0 when the tier was NOT RUN (it says why).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/kind/lib.sh
LOG_TAG=kind-tier
started_at="${DDPJOB_TEST_STARTED_AT:-$(date +%s)}"
start_by="${DDPJOB_KIND_START_BY_S:-2700}"
limit="${DDPJOB_TEST_LIMIT_S:-5100}"
needs="${DDPJOB_KIND_TIER_NEEDS_S:-1700}"
timings="${DDPJOB_KIND_TIMINGS:-/dev/null}"
prepare_log="$DDPJOB_CACHE/test-kind-prepare.log"
elapsed() { echo $(($(date +%s) - started_at)); }
timing() { printf '%-34s %5d s  %s\n' "$1" "$2" "$3" >>"$timings"; }

prepare_pid="" suite_pid=""
stop() {  # test.sh stopping (its limit, Ctrl-C, its own end): what runs goes with it
  [[ -n "$prepare_pid" ]] && kill -TERM -- "-$prepare_pid" 2>/dev/null
  [[ -n "$suite_pid" ]] && kill -TERM "$suite_pid" 2>/dev/null
  wait 2>/dev/null || true
  exit 143
}
trap stop TERM INT

mkdir -p "$DDPJOB_CACHE"
log "building the kind tier's images in the background (log: $prepare_log)"
t0=$(date +%s)
low_priority=(nice -n 19); command -v ionice >/dev/null && low_priority+=(ionice -c 3)
setsid "${low_priority[@]}" bash scripts/kind/prepare.sh >"$prepare_log" 2>&1 &
prepare_pid=$!
while kill -0 "$prepare_pid" 2>/dev/null && (($(elapsed) < start_by)); do sleep 5; done
if kill -0 "$prepare_pid" 2>/dev/null; then
  kill -TERM -- "-$prepare_pid" 2>/dev/null || true
  wait "$prepare_pid" 2>/dev/null || true
  prepare_pid=""
  timing "kind builds (prepare.sh)" $(($(date +%s) - t0)) "(stopped, unfinished)"
  log "kind tier NOT RUN: its builds were not done ${start_by} s after the start (a cold"
  log "machine; each finished step is cached for the next run). Where they were:"
  grep '\[kind/prepare\] \[' "$prepare_log" | sed 's/^/  /' >&2 || true
  exit 0
fi
prepare_rc=0
wait "$prepare_pid" || prepare_rc=$?
prepare_pid=""
timing "kind builds (prepare.sh)" $(($(date +%s) - t0)) "(rc $prepare_rc)"
grep '\[kind/prepare\] \[' "$prepare_log" | sed 's/^/  /' >&2 || true
if ((prepare_rc != 0)); then
  log "ERROR: the kind tier's builds failed (rc $prepare_rc); the end of $prepare_log:"
  tail -n 40 "$prepare_log" >&2
  exit 1
fi
# The suite needs this command's setup (the project and the test tools installed): test.sh
# says so with a file (and stops this script if its setup fails).
if [[ -n "${DDPJOB_KIND_SETUP_DONE:-}" ]]; then
  while [[ ! -e "$DDPJOB_KIND_SETUP_DONE" ]]; do sleep 2; done
fi
left=$((limit - $(elapsed)))
if ((left < needs)); then
  log "kind tier NOT RUN: ${left} s left before the ${limit} s limit, and the tier needs"
  log "${needs} s (DDPJOB_KIND_TIER_NEEDS_S); its builds are cached for the next run"
  exit 0
fi
export PYTEST_DEBUG_TEMPROOT="$(mktemp -d)"  # not the temp root of tier 1's pytest beside it
log "the kind suite starts $(elapsed) s after the test command"
t0=$(date +%s)
suite_rc=0
DDPJOB_KIND_REQUIRED=1 timeout --signal=TERM --kill-after=60 "$left" bash scripts/e2e-kind.sh &
suite_pid=$!
wait "$suite_pid" || suite_rc=$?
suite_pid=""
timing "kind tier (e2e-kind.sh)" $(($(date +%s) - t0)) "(rc $suite_rc)"
exit $suite_rc
