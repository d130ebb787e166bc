#!/bin/bash
# Runs bench/trace_ops.py's test with the project's python (torch for the peer's trace).
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
exec tools/python3 bench/trace_ops_test.py
