#!/bin/bash
# Runs tp_bench's arithmetic, parsing and rendering test with the project's python.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
exec tools/python3 bench/tp_bench_test.py
