#!/usr/bin/env bash
# An elastic restart under torchrun: `torchrun --max-restarts=1` runs 2 pretrain ranks with
# --resume=auto and a checkpoint every 5 steps; once the first checkpoint is committed one worker is
# SIGKILLed. torchrun stops the other, starts both again (attempt 1: TORCHELASTIC_RESTART_COUNT=1,
# which rendezvouses under its own store prefix), they resume from `latest` and finish. The result
# must be bitwise the params of an uninterrupted run (resume at the same rank count is bitwise).
#   $1: tools/python3   $2: the pretrain binary
set -euo pipefail
python3="$(readlink -f "$1")"
pretrain="$(readlink -f "$2")"
work="$(mktemp -d)"
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$work/err" >&2 2>/dev/null || true; exit 1; }
json_field() { "$python3" -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

common=(--steps=60 --global_batch=16 --eval_every=0 --check_every=0 --max_grad_norm=0
        --distributed_timeout_s=20)
straight="$("$pretrain" --nproc_per_node=2 "${common[@]}" | tail -1)"

"$python3" -m torch.distributed.run --standalone --no-python --nproc-per-node=2 --max-restarts=1 \
  "$pretrain" "${common[@]}" --save_every=5 --keep_checkpoints=2 --resume=auto \
  --save_dir="$work/ckpt" >"$work/out" 2>"$work/err" &
launcher=$!
for _ in $(seq 600); do [[ -e "$work/ckpt/latest" ]] && break; sleep 0.05; done
[[ -e "$work/ckpt/latest" ]] || fail "no checkpoint appeared"
# One worker of attempt 0 (a child of torchrun's agent running pretrain).
victim="$(pgrep -P "$launcher" -f "$pretrain" | head -1 || true)"
[[ -z "$victim" ]] && victim="$(pgrep -f -- "--save_dir=$work/ckpt" | grep -v "^$launcher\$" | tail -1)"
[[ -n "$victim" ]] || fail "no worker to kill"
killed_at="$(cat "$work/ckpt/latest")"
kill -9 "$victim"
wait "$launcher" || fail "torchrun exited $? after the restart"
# The kill was seen (torchrun reports the worker's exit by SIGKILL) and attempt 1 resumed.
grep -q "exitcode: -9" "$work/err" || fail "torchrun did not report the killed worker"
grep -q "pretrain: resumed from the checkpoint of step" "$work/out" \
  || fail "no rank 0 resumed from a checkpoint: $(grep "pretrain:" "$work/out")"
last="$(tail -1 "$work/out")"
[[ "$(json_field "$last" steps)" == 60 ]] || fail "the restarted run ended at $(json_field "$last" steps)"
[[ "$(json_field "$last" param_checksum)" == "$(json_field "$straight" param_checksum)" ]] \
  || fail "params differ: restarted $last, straight $straight"
echo "PASS: worker $victim killed after checkpoint $killed_at; torchrun restarted the ranks, which" \
  "resumed (--resume=auto) and ended bitwise as the uninterrupted run"
