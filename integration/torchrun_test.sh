#!/usr/bin/env bash
# pretrain under PyTorch's own launcher: `torchrun --standalone --no-python --nproc-per-node=2
# pretrain ...` (torchrun from the pinned torch wheel, run by tools/python3). The ranks must find each
# other from torchrun's environment alone and rank 0 must print the JSON summary last.
#   $1: tools/python3   $2: the pretrain binary
set -euo pipefail
python3="$(readlink -f "$1")"
pretrain="$(readlink -f "$2")"
out="$("$python3" -m torch.distributed.run --standalone --no-python --nproc-per-node=2 \
        "$pretrain" --steps=12 --eval_every=0 --log_every=4)"
echo "$out"
last="$(echo "$out" | tail -1)"
"$python3" - "$last" <<'PY'
import json, sys
summary = json.loads(sys.argv[1])
assert summary["world_size"] == 2, summary
assert summary["steps"] == 12, summary
assert summary["final_loss"] < summary["initial_loss"] - 0.3, summary
print("PASS: torchrun run, world_size 2, loss %.3f -> %.3f" % (summary["initial_loss"], summary["final_loss"]))
PY
