#!/usr/bin/env bash
# A rank waiting in the rendezvous for a peer that never comes must end promptly on SIGTERM or
# SIGINT, not at the rendezvous timeout: exit 128 + the signal with one line naming the rank and the
# signal. Rank 0 hosts the store and waits for rank 1; then rank 1 waits for a store nobody hosts.
#   $1: the pretrain binary  $2: integration/testing/ports.sh
set -uo pipefail
pretrain="$(readlink -f "$1")"
work="${TEST_TMPDIR:-$(mktemp -d)}"
source "$2"  # listening, free_port

fail() { echo "FAIL: $*" >&2; echo "--- stderr"; cat "$work/err" 2>/dev/null; \
         [[ -n "${pid:-}" ]] && kill -9 "$pid" 2>/dev/null; exit 1; }
now() { date +%s.%N; }

# A port nothing listens on.
port="$(free_port)" || fail "no free port found"

# $1: rank  $2: signal name  $3: expected exit code
run_case() {
  local rank=$1 signal=$2 expected=$3
  env -u SLURM_PROCID -u SLURM_NTASKS RANK="$rank" WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" ORTHOSHARD_JOB_ID="rdzv-signal-test-$rank" \
      "$pretrain" --steps=5 --distributed_timeout_s=60 >"$work/out" 2>"$work/err" &
  pid=$!
  # In the rendezvous: rank 0 listens on the port; rank 1 retries connecting to it (no sign to
  # wait for: 4 s is far longer than the input checks before the rendezvous take).
  if [[ $rank -eq 0 ]]; then
    for _ in $(seq 1 300); do
      listening "$port" && break
      kill -0 "$pid" 2>/dev/null || fail "rank 0 ended before the signal"
      sleep 0.1
    done
    listening "$port" || fail "rank 0 did not listen on $port within 30 s"
    sleep 1
  else
    sleep 4
  fi
  kill -0 "$pid" 2>/dev/null || fail "rank $rank ended before the signal"
  local start
  start=$(now)
  kill -"$signal" "$pid"
  # Promptly: the rendezvous timeout is 60 s; allow 10 s on a busy machine.
  while kill -0 "$pid" 2>/dev/null && awk -v a="$start" -v b="$(now)" 'BEGIN{exit !(b - a < 10)}'; do
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null && fail "rank $rank still running 10 s after SIG$signal"
  wait "$pid"
  local rc=$?
  local elapsed
  elapsed=$(awk -v a="$start" -v b="$(now)" 'BEGIN{printf "%.2f", b - a}')
  pid=""
  [[ $rc -eq $expected ]] || fail "rank $rank exited $rc after SIG$signal, expected $expected"
  grep -q "^pretrain: rank $rank: stopped by SIG$signal during the rendezvous at 127.0.0.1:$port .*exit code $expected$" \
      "$work/err" || fail "rank $rank printed no line naming the rank and SIG$signal"
  echo "PASS: rank $rank exited $rc ${elapsed}s after SIG$signal: $(grep "^pretrain:" "$work/err")"
}

run_case 0 TERM 143
run_case 1 INT 130
exit 0
