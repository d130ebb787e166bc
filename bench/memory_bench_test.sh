#!/bin/bash
# Runs memory_bench's arithmetic and rendering test with the project's python.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
exec tools/python3 bench/memory_bench_test.py
