#!/usr/bin/env bash
# Rank 0 of a 2-rank `pretrain` is SIGKILLed while it commits a checkpoint (held there: `latest` is
# written through `latest.tmp`, here a FIFO nobody reads, so its open() blocks), rank 1 waiting for
# the commit's outcome. Rank 1 must fail naming rank 0 and the collective that lost it, not only
# "communicator ... is unusable": the commit's failure is followed by another collective of the
# save, whose error is the communicator's refusal, which must carry the first failure.
#   $1: the pretrain binary
set -uo pipefail
pretrain="$(readlink -f "$1")"
work="${TEST_TMPDIR:-$(mktemp -d)}"
save="$work/save"
mkdir -p "$save"
mkfifo "$save/latest.tmp"
"$pretrain" --nproc_per_node=2 --steps=6 --save_every=2 --eval_every=0 --global_batch=16 \
    --distributed_timeout_s=30 --save_dir="$save" >"$work/out" 2>"$work/err" &
launcher=$!
fail() { echo "FAIL: $*" >&2; echo "--- stdout"; tail -20 "$work/out"; echo "--- stderr"; cat "$work/err"; \
         pkill -9 -P "$launcher" 2>/dev/null; kill -9 "$launcher" 2>/dev/null; exit 1; }

# Rank 0 renames step_000002.tmp to step_000002, then blocks writing `latest`.
for _ in $(seq 1 600); do
  [[ -d "$save/step_000002" ]] && break
  kill -0 "$launcher" 2>/dev/null || fail "pretrain ended before the commit"
  sleep 0.1
done
[[ -d "$save/step_000002" ]] || fail "rank 0 did not reach the commit of step 2 within 60 s"
ranks=$(pgrep -P "$launcher")
victim=""
for pid in $ranks; do
  if grep -qxz "RANK=0" "/proc/$pid/environ" 2>/dev/null; then victim=$pid; fi
done
[[ -n "$victim" ]] || fail "no rank 0 among the launcher's children"
sleep 0.5  # rank 1 is in the commit's all-reduce by now (rank 0 finished the one before it)
kill -9 "$victim"
killed_at=$SECONDS
while kill -0 "$launcher" 2>/dev/null && (( SECONDS - killed_at < 60 )); do sleep 0.2; done
kill -0 "$launcher" 2>/dev/null && fail "launcher still running 60 s after rank 0 was killed"
wait "$launcher"
rc=$?
[[ $rc -ne 0 ]] || fail "launcher exited 0 after rank 0 was killed"
for pid in $ranks; do
  kill -0 "$pid" 2>/dev/null && fail "rank process $pid left behind"
done
line=$(grep -m1 "^\[rank 1\] pretrain: " "$work/err")
[[ -n "$line" ]] || fail "rank 1 printed no error"
grep -q "all_reduce #[0-9]* failed on rank 1: " <<<"$line" || fail "rank 1 did not name the collective: $line"
grep -q "not launched by rank 0\|rank 0 reported no failure" <<<"$line" || fail "rank 1 did not name rank 0: $line"
echo "PASS: launcher exit $rc; rank 1 named rank 0 and the collective:"
echo "$line"
