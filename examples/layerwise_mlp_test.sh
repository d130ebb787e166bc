#!/usr/bin/env bash
# The example trains on 2 local ranks; its last line reads "layerwise_mlp: loss A -> B (chance: C)".
set -euo pipefail
out="$("$1" --nproc=2 --steps=60)"
echo "$out"
last="$(echo "$out" | grep 'layerwise_mlp: loss' | tail -1)"
[[ -n "$last" ]] || { echo "FAIL: no final loss line" >&2; exit 1; }
read -r first final chance < <(echo "$last" | sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+) \(chance: ([0-9.]+)\).*/\1 \2 \3/')
# A learning threshold, not a tolerance: the final loss measured 0.112 (avx512, avx2) and 0.139
# (SSE4.1/default kernels) against 0.5 * chance = 0.693; the printed losses of steps 30..59, one
# batch each, stay within 0.11 .. 0.30, so one noisy last batch keeps a margin above 2x.
awk -v a="$first" -v b="$final" -v c="$chance" 'BEGIN {
  if (!(b < 0.5 * c && b < 0.5 * a)) { printf "FAIL: loss %s -> %s, chance %s\n", a, b, c; exit 1 }
  printf "PASS: loss %s -> %s (chance %s)\n", a, b, c }'
