#!/usr/bin/env bash
# A checkpoint save that cannot be written (the file-size limit makes write() fail with EFBIG, as a full
# disk fails with ENOSPC) must stop the run with an error naming the file, leave `latest` at the
# previous checkpoint, and leave that checkpoint intact.
#   $1: the pretrain binary   $2: the ckpt tool
set -uo pipefail
pretrain="$(readlink -f "$1")"
ckpt="$(readlink -f "$2")"
dir="${TEST_TMPDIR:-$(mktemp -d)}/save"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$pretrain" --steps=6 --stop_after=2 --eval_every=0 --global_batch=16 --save_dir="$dir" >/dev/null \
  || fail "the first run (saving step 2) failed"
[[ "$(cat "$dir/latest")" == "step_000002" ]] || fail "latest is '$(cat "$dir/latest")' after the first run"

# Resume with a 100 KiB file-size limit: the step-4 shards (~0.5 MB each) cannot be written.
( trap '' XFSZ; ulimit -f 100
  exec "$pretrain" --steps=6 --resume --save_every=2 --eval_every=0 --global_batch=16 \
       --save_dir="$dir" >"$dir.out" 2>"$dir.err" )
rc=$?
cat "$dir.err"
[[ $rc -ne 0 ]] || fail "the run whose save failed exited 0"
grep -q "write($dir/step_000004.tmp/rank[01].safetensors): File too large" "$dir.err" \
  || fail "no error naming the shard file"
[[ "$(cat "$dir/latest")" == "step_000002" ]] || fail "latest moved to '$(cat "$dir/latest")'"
[[ ! -e "$dir/step_000004" ]] || fail "a step_000004 checkpoint was committed"
"$ckpt" verify "$dir/step_000002" || fail "the previous checkpoint no longer verifies"
echo "PASS: save failure stopped the run (exit $rc), latest still step_000002 and it verifies"
