#!/usr/bin/env bash
# --on_save_failure=continue: a checkpoint save that fails is reported on every rank and counted, the
# run trains on to its last step and tries the next saves, and `latest` only ever points at a complete
# checkpoint that verifies. A failed final save, or --max_consecutive_failed_saves failures in a row,
# still exits non-zero.
#   $1: the pretrain binary   $2: the ckpt tool
set -uo pipefail
pretrain="$(readlink -f "$1")"
ckpt="$(readlink -f "$2")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }
common=(--eval_every=0 --global_batch=16 --save_every=2 --on_save_failure=continue)

# 1. One save fails, the later ones are written: a stray file where step 4's directory would go makes
#    rank 0 refuse to begin that save (a deterministic failure; a filling disk is not).
dir="$tmp/one"
mkdir -p "$dir" && touch "$dir/step_000004"
"$pretrain" --steps=8 "${common[@]}" --save_dir="$dir" >"$dir.out" 2>"$dir.err"
rc=$?
cat "$dir.err"
[[ $rc -eq 0 ]] || fail "exit $rc although only the step-4 save failed"
for rank in 0 1; do
  grep -q "^\[rank $rank\] warning: checkpoint of step 4 in $dir failed: .*; training goes on" \
    "$dir.err" || fail "rank $rank did not report the failed step-4 save"
done
grep -q "^\[rank 0\] warning: .*$dir/step_000004 exists and is not a checkpoint directory" "$dir.err" \
  || fail "rank 0's report does not give the cause"
json="$(tail -1 "$dir.out")"
[[ "$json" == *'"steps":8,'* && "$json" == *'"failed_saves":1,'* ]] \
  || fail "the JSON line does not say 8 steps and 1 failed save: $json"
[[ "$(cat "$dir/latest")" == "step_000008" ]] || fail "latest is '$(cat "$dir/latest")', not step_000008"
"$ckpt" verify "$dir/step_000008" || fail "the final checkpoint does not verify"
[[ -d "$dir/step_000006" && -f "$dir/step_000004" ]] || fail "step 6 missing or the stray file gone"

# 2. Rank 1's shard writes fail (a 100 KiB file-size limit: EFBIG, as a full disk gives ENOSPC), rank
#    0's succeed: both ranks must take the same branch. The ranks are started by hand, as torchrun
#    would, so that only rank 1 gets the limit.
dir="$tmp/efbig"
"$pretrain" --steps=6 --stop_after=2 --eval_every=0 --global_batch=16 --save_dir="$dir" >/dev/null \
  || fail "the first run (saving step 2) failed"
port=$((20000 + RANDOM % 30000))
env_for() { echo "RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port"; }
args=(--steps=6 --resume "${common[@]}" --save_dir="$dir")
env $(env_for 0) "$pretrain" "${args[@]}" >"$dir.out0" 2>"$dir.err0" &
pid0=$!
( trap '' XFSZ; ulimit -f 100; exec env $(env_for 1) "$pretrain" "${args[@]}" >"$dir.out1" 2>"$dir.err1" )
rc1=$?
wait "$pid0"
rc0=$?
cat "$dir.err0" "$dir.err1"
grep -q "^eval step 6:" "$dir.out0" || fail "training did not reach step 6"
[[ $rc0 -eq 1 && $rc1 -eq 1 ]] || fail "exit codes $rc0, $rc1 after a failed final save (expected 1, 1)"
grep -q "warning: checkpoint of step 4 in $dir failed: write($dir/step_000004.tmp/rank1.safetensors): File too large; training goes on" \
  "$dir.err1" || fail "rank 1 did not report its failed step-4 shard"
grep -q "warning: checkpoint of step 4 in $dir failed: another rank failed to write its shard; training goes on" \
  "$dir.err0" || fail "rank 0 did not report the failed step-4 save"
grep -q "final checkpoint of step 6 in $dir failed: write($dir/step_000006.tmp/rank1.safetensors)" \
  "$dir.err1" || fail "rank 1's error does not name the final shard"
grep -q "final checkpoint of step 6 in $dir failed: another rank failed to write its shard" \
  "$dir.err0" || fail "rank 0's error does not report the failed final save"
[[ "$(cat "$dir/latest")" == "step_000002" ]] || fail "latest moved to '$(cat "$dir/latest")'"
[[ ! -e "$dir/step_000004" && ! -e "$dir/step_000006" ]] || fail "a failed save was committed"
[[ -z "$(ls -d "$dir"/*.tmp 2>/dev/null)" ]] || fail "partial directories left: $(ls -d "$dir"/*.tmp)"
"$ckpt" verify "$dir/step_000002" || fail "the previous checkpoint no longer verifies"

# 3. Every save fails (the limit on both ranks): the run stops after 2 failures in a row.
( trap '' XFSZ; ulimit -f 100
  exec "$pretrain" --steps=12 --resume "${common[@]}" --max_consecutive_failed_saves=2 \
       --save_dir="$dir" >"$dir.out3" 2>"$dir.err3" )
rc=$?
cat "$dir.err3"
[[ $rc -eq 1 ]] || fail "exit $rc after 2 failed saves in a row (expected 1)"
grep -q "checkpoint of step 6 in $dir failed: .*; 2 saves in a row failed (--max_consecutive_failed_saves=2), stopping" \
  "$dir.err3" || fail "no message about stopping after 2 failed saves"
[[ "$(cat "$dir/latest")" == "step_000002" ]] || fail "latest moved to '$(cat "$dir/latest")'"
"$ckpt" verify "$dir/step_000002" || fail "the previous checkpoint no longer verifies"
echo "PASS: a failed save was reported on both ranks and training went on (1 failed, latest step_000008);" \
  "rank-1-only EFBIG agreed on both ranks, failed final save exit 1; stopped after 2 failures in a row"
