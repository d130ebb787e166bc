#!/usr/bin/env bash
# Runs a Python test with the project's interpreter (tools/python3: the pinned torch, transformers,
# tokenizers, megatron-core importable): $1 the tools/python3 runfile, $2 the script, then its args.
set -euo pipefail
python3="$(readlink -f "$1")"
script="$2"
shift 2
export PYTHONDONTWRITEBYTECODE=1
exec "$python3" -W ignore::UserWarning "$script" "$@"
