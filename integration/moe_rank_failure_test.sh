#!/usr/bin/env bash
# A rank of a 2-rank `pretrain --model=moe-tiny --ep=2` is lost while the ranks exchange tokens:
# SIGKILLed, then (a new job) SIGSTOPped. The survivor must fail on its own within the distributed
# timeout (the stopped rank is then killed by the launcher as soon as rank 0 exited), with an error
# naming the expert all-to-all and rank 1; the launcher exits non-zero and no rank process is left.
#
# Where the survivor blocks depends on where rank 1 was stopped: in its next collective that rank 1
# never launched. Each micro-batch runs 20 all-to-alls (4 layers: counts, dispatch and combine
# forward, dispatch and combine backward), and with 8 micro-batches and AdamW (a cheap step) almost
# all of a step lies between its first and last all-to-all (measured: 7 of 7 signals landed in
# one). A signal that lands in the step's other collectives (grad sync, step agreement) is a valid
# failure too, so a job that fails naming rank 1 elsewhere is retried, up to 3 jobs per signal.
#   $1: the pretrain binary
set -uo pipefail
pretrain="$(readlink -f "$1")"
work="${TEST_TMPDIR:-$(mktemp -d)}"
launcher=""

fail() {
  echo "FAIL: $*" >&2; echo "--- stdout"; tail -5 "$work/out"; echo "--- stderr"; cat "$work/err"
  if [[ -n "$launcher" ]]; then
    pkill -9 -P "$launcher" 2>/dev/null
    kill -9 "$launcher" 2>/dev/null
  fi
  exit 1
}

# $1: KILL or STOP. Starts a job, signals rank 1 once training runs; sets `rc`, `elapsed` and
# `ranks` (the rank pids) when the launcher has ended.
lose_rank_1() {
  "$pretrain" --model=moe-tiny --ep=2 --nproc_per_node=2 --steps=100000 --eval_every=0 \
      --check_every=0 --global_batch=16 --micro_batches=8 --optimizer=adamw --dist=distopt \
      --log_every=1 --distributed_timeout_s=5 >"$work/out" 2>"$work/err" &
  launcher=$!
  for _ in $(seq 1 600); do
    [[ $(grep -c "step " "$work/out") -ge 2 ]] && break
    kill -0 "$launcher" 2>/dev/null || fail "pretrain ended before the $1"
    sleep 0.1
  done
  [[ $(grep -c "step " "$work/out") -ge 2 ]] || fail "training did not start within 60 s"
  ranks=$(pgrep -P "$launcher")
  local victim=""
  for pid in $ranks; do
    if grep -qxz "RANK=1" "/proc/$pid/environ" 2>/dev/null; then victim=$pid; fi
  done
  [[ -n "$victim" ]] || fail "no rank 1 among the launcher's children"
  kill -"$1" "$victim"
  local lost_at=$SECONDS
  while kill -0 "$launcher" 2>/dev/null && (( SECONDS - lost_at < 60 )); do sleep 0.2; done
  kill -0 "$launcher" 2>/dev/null && fail "launcher still running 60 s after SIG$1 of rank 1"
  wait "$launcher"
  rc=$?
  launcher=""
  elapsed=$(( SECONDS - lost_at ))
}

for signal in KILL STOP; do
  named=""
  for attempt in 1 2 3; do
    lose_rank_1 "$signal"
    [[ $rc -ne 0 ]] || fail "launcher exited 0 after SIG$signal of rank 1"
    for pid in $ranks; do
      kill -0 "$pid" 2>/dev/null && fail "rank process $pid left behind after SIG$signal"
    done
    error=$(grep -m1 "^\[rank 0\] pretrain: " "$work/err")
    [[ -n "$error" ]] || fail "rank 0 printed no error after SIG$signal of rank 1"
    [[ "$error" == *"rank 1"* ]] || fail "rank 0's error names no rank 1: $error"
    grep -q "^\[rank 0\].*LibTorch error" "$work/err" && fail "rank 0 reported a LibTorch error"
    if [[ "$signal" == STOP ]]; then
      [[ "$error" == *"did not complete within 5s"* || "$error" == *"timed out"* ]] ||
          fail "rank 0's error after SIGSTOP is not a timeout: $error"
    fi
    all_to_all='moe (dispatch|combine)( counts)? all-to-all( \(backward\))? on ep rank 0 of 2'
    if [[ "$error" =~ $all_to_all ]]; then
      named=$error
      break
    fi
    echo "attempt $attempt: SIG$signal landed outside the all-to-alls: $error"
  done
  [[ -n "$named" ]] || fail "3 jobs lost rank 1 (SIG$signal) and none failed in an all-to-all"
  echo "PASS SIG$signal: launcher exit $rc ${elapsed}s after the signal; rank 0: $named"
done
exit 0
