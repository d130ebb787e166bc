#!/usr/bin/env bash
# Two processes claim RANK=1 of one 2-rank job (a launcher or a script numbering ranks wrongly).
# One of them must fail within seconds, naming the rank, the process that holds it and "started
# twice" as the likely cause; rank 0 and the other rank 1 train on (and stop on SIGTERM).
#   $1: the pretrain binary  $2: integration/testing/ports.sh
set -uo pipefail
pretrain="$(readlink -f "$1")"
work="${TEST_TMPDIR:-$(mktemp -d)}"
source "$2"  # listening, free_port

pids=()
fail() { echo "FAIL: $*" >&2; for f in "$work"/err*; do echo "--- $f"; cat "$f"; done; \
         for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; exit 1; }

port="$(free_port)" || fail "no free port found"

# $1: rank  $2: output name
start_rank() {
  env -u SLURM_PROCID -u SLURM_NTASKS RANK="$1" WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" ORTHOSHARD_JOB_ID=duplicate-rank-test \
      "$pretrain" --steps=100000 --eval_every=0 --check_every=0 --global_batch=8 \
      --distributed_timeout_s=60 >"$work/out$2" 2>"$work/err$2" &
}

start_rank 0 0
pids+=($!)
rank0=$!
for _ in $(seq 1 300); do
  listening "$port" && break
  kill -0 "$rank0" 2>/dev/null || fail "rank 0 ended before the others started"
  sleep 0.1
done
start_rank 1 a
pids+=($!)
first=$!
sleep 1
start_rank 1 b
pids+=($!)
second=$!
started=$SECONDS

# One of the two rank-1 processes fails at once (whichever claimed the rank second).
loser=""
while [[ -z "$loser" ]] && (( SECONDS - started < 30 )); do
  kill -0 "$first" 2>/dev/null || loser=$first
  kill -0 "$second" 2>/dev/null || loser=$second
  sleep 0.1
done
[[ -n "$loser" ]] || fail "neither rank-1 process ended within 30 s"
elapsed=$(( SECONDS - started ))
if [[ "$loser" == "$first" ]]; then winner=$second; name=a; else winner=$first; name=b; fi
wait "$loser"
rc=$?
[[ $rc -ne 0 ]] || fail "the duplicate rank 1 exited 0"
grep -q "rank 1: rank 1 of job duplicate-rank-test is already taken by host .* pid $winner (this is host .* pid $loser): rank 1 was probably started twice" \
    "$work/err$name" || fail "the duplicate's error does not name rank 1, pid $winner and the cause"

# The job goes on with rank 0 and the other rank 1: both train until stopped.
sleep 2
for p in "$rank0" "$winner"; do
  kill -0 "$p" 2>/dev/null || fail "process $p of the job ended after the duplicate failed"
done
kill -TERM "$rank0" "$winner"
for p in "$rank0" "$winner"; do
  for _ in $(seq 1 1200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "process $p still running 120 s after SIGTERM"
  wait "$p"
  code=$?
  [[ $code -eq 143 ]] || fail "process $p of the job exited $code after SIGTERM, expected 143"
done
echo "PASS: the duplicate rank 1 exited $rc after ${elapsed}s: $(grep "rank 1 of job" "$work/err$name")"
exit 0
