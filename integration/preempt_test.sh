#!/usr/bin/env bash
# SIGTERM to a 2-rank `pretrain` (what SLURM or Kubernetes sends before preempting a job), twice: the
# launcher forwards it, both ranks finish the same step, save it as a checkpoint and exit 143 (128 + SIGTERM);
# rank 0's JSON line says "stop_signal":15. `--resume` then finishes the run, ending at the same loss
# and params, bitwise, as a run that was never interrupted. Then SIGHUP, which must stop the same way.
#   $1: the pretrain binary   $2: the ckpt tool
set -uo pipefail
pretrain="$(readlink -f "$1")"
ckpt="$(readlink -f "$2")"
work="${TEST_TMPDIR:-$(mktemp -d)}"
dir="$work/ckpt"
common=(--steps=60 --eval_every=0 --check_every=0 --global_batch=16 --log_every=1)

fail() { echo "FAIL: $*" >&2; echo "--- stdout"; tail -20 "$work/out"; echo "--- stderr"; \
         cat "$work/err"; [[ -n "${launcher:-}" ]] && kill -9 "$launcher" 2>/dev/null; exit 1; }
json_field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" <<<"$1"; }

"$pretrain" "${common[@]}" --save_dir="$dir" >"$work/out" 2>"$work/err" &
launcher=$!
for _ in $(seq 1 300); do
  [[ $(grep -c "step " "$work/out") -ge 3 ]] && break
  kill -0 "$launcher" 2>/dev/null || fail "pretrain ended before the signal"
  sleep 0.1
done
[[ $(grep -c "step " "$work/out") -ge 3 ]] || fail "training did not start within 30 s"
# Twice, as SLURM and torchrun together deliver it: a repeat within 2 s is the same request. (Back to
# back: the launcher itself takes the default action again once its ranks have ended.)
kill -TERM "$launcher"
kill -TERM "$launcher"
# And once more later, when the ranks may be saving or the launcher ending: still one request.
sleep 0.2
kill -TERM "$launcher" 2>/dev/null
signalled_at=$SECONDS
while kill -0 "$launcher" 2>/dev/null && (( SECONDS - signalled_at < 60 )); do sleep 0.1; done
kill -0 "$launcher" 2>/dev/null && fail "pretrain still running 60 s after SIGTERM"
wait "$launcher"
rc=$?
launcher=""
[[ $rc -eq 143 ]] || fail "exit $rc after SIGTERM, expected 143"
json="$(tail -1 "$work/out")"
[[ "$(json_field "$json" stop_signal)" == "15" ]] || fail "no \"stop_signal\":15 in the last line: $json"
steps="$(json_field "$json" steps)"
(( steps >= 3 && steps < 60 )) || fail "stopped after step '$steps'"
step_dir="$(printf 'step_%06d' "$steps")"
grep -q "pretrain: stopped after step $steps of 60 on SIGTERM; checkpoint of step $steps saved in $dir" \
  "$work/out" || fail "no stop message naming step $steps"
[[ "$(cat "$dir/latest")" == "$step_dir" ]] || fail "latest is '$(cat "$dir/latest")', not $step_dir"
"$ckpt" verify "$dir/$step_dir" >/dev/null || fail "the checkpoint of the stop does not verify"
grep -q "failed first" "$work/err" && fail "the launcher reported a graceful stop as a failure"

"$pretrain" "${common[@]}" --save_dir="$dir" --resume >"$work/out" 2>"$work/err" \
  || fail "the resumed run failed"
resumed="$(tail -1 "$work/out")"
"$pretrain" "${common[@]}" >"$work/out" 2>"$work/err" || fail "the straight run failed"
straight="$(tail -1 "$work/out")"
for field in steps stop_signal final_loss param_checksum; do
  [[ "$(json_field "$resumed" $field)" == "$(json_field "$straight" $field)" ]] \
    || fail "$field differs: resumed $resumed, straight $straight"
done
echo "PASS: SIGTERM after step $steps: exit 143, $step_dir saved and verified; the resumed run ends" \
     "as the straight one (param_checksum $(json_field "$straight" param_checksum))"

# SIGHUP (the terminal or ssh session that started the job closed) is a stop request too: exit 129
# (128 + SIGHUP) with the step saved.
dir="$work/ckpt_hup"
"$pretrain" "${common[@]}" --save_dir="$dir" >"$work/out" 2>"$work/err" &
launcher=$!
for _ in $(seq 1 300); do
  [[ $(grep -c "step " "$work/out") -ge 3 ]] && break
  kill -0 "$launcher" 2>/dev/null || fail "pretrain ended before SIGHUP"
  sleep 0.1
done
kill -HUP "$launcher"
signalled_at=$SECONDS
while kill -0 "$launcher" 2>/dev/null && (( SECONDS - signalled_at < 60 )); do sleep 0.1; done
kill -0 "$launcher" 2>/dev/null && fail "pretrain still running 60 s after SIGHUP"
wait "$launcher"
rc=$?
launcher=""
[[ $rc -eq 129 ]] || fail "exit $rc after SIGHUP, expected 129"
json="$(tail -1 "$work/out")"
[[ "$(json_field "$json" stop_signal)" == "1" ]] || fail "no \"stop_signal\":1 in the last line: $json"
steps="$(json_field "$json" steps)"
grep -q "pretrain: stopped after step $steps of 60 on SIGHUP; checkpoint of step $steps saved" \
  "$work/out" || fail "no SIGHUP stop message naming step $steps"
"$ckpt" verify "$dir" >/dev/null || fail "the checkpoint of the SIGHUP stop does not verify"
echo "PASS: SIGHUP after step $steps: exit 129, the step saved and verified"
