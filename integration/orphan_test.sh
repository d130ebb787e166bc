#!/usr/bin/env bash
# The launcher of a `pretrain` job dies (SIGKILL of torchrun's agent, a launcher other than the
# built-in one). Its ranks must not train on as orphans: each gets a SIGTERM from the kernel
# (PR_SET_PDEATHSIG), so they stop together after the step in flight, save it, and exit 143. The
# checkpoint must verify, and no rank may be left running.
#   $1: tools/python3   $2: the pretrain binary   $3: the ckpt tool
set -uo pipefail
python3="$(readlink -f "$1")"
pretrain="$(readlink -f "$2")"
ckpt="$(readlink -f "$3")"
work="${TEST_TMPDIR:-$(mktemp -d)}"
dir="$work/ckpt"
"$python3" -m torch.distributed.run --standalone --no-python --nproc-per-node=2 "$pretrain" \
    --steps=100000 --eval_every=0 --check_every=0 --global_batch=16 --log_every=1 \
    --save_dir="$dir" --save_every=100000 >"$work/out" 2>"$work/err" &
agent=$!

ranks=""
fail() { echo "FAIL: $*" >&2; echo "--- stdout"; tail -20 "$work/out"; echo "--- stderr"; \
         tail -40 "$work/err"; kill -9 "$agent" $ranks 2>/dev/null; exit 1; }

# Wait for training to run (a few progress lines), then note the agent's children: the ranks.
for _ in $(seq 1 600); do
  [[ $(grep -c "step " "$work/out") -ge 3 ]] && break
  kill -0 "$agent" 2>/dev/null || fail "torchrun ended before the kill"
  sleep 0.1
done
[[ $(grep -c "step " "$work/out") -ge 3 ]] || fail "training did not start within 60 s"
ranks=$(pgrep -P "$agent")
[[ $(echo "$ranks" | wc -w) -eq 2 ]] || fail "expected 2 ranks under torchrun, found: $ranks"
kill -9 "$agent"
killed_at=$SECONDS

# Both ranks must end on their own, promptly (a step, a save and an exit: seconds).
for pid in $ranks; do
  while kill -0 "$pid" 2>/dev/null && (( SECONDS - killed_at < 60 )); do sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && fail "rank process $pid still running 60 s after its launcher died"
done
elapsed=$(( SECONDS - killed_at ))
grep -q "pretrain: stopped after step [0-9]* of 100000 on SIGTERM; checkpoint of step [0-9]* saved in $dir" \
    "$work/out" || fail "rank 0 did not report a graceful stop with a checkpoint"
step=$(sed -n 's/.*stopped after step \([0-9]*\) of .*/\1/p' "$work/out" | head -1)
[[ "$(cat "$dir/latest")" == "$(printf 'step_%06d' "$step")" ]] \
    || fail "latest is '$(cat "$dir/latest")', not step $step"
"$ckpt" verify "$dir" >/dev/null || fail "the checkpoint of step $step does not verify"
echo "PASS: torchrun's agent SIGKILLed; both ranks stopped within ${elapsed} s, step $step saved and verified"
