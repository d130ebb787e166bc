#!/bin/bash
# Runs tp_plan_bench's rendering test with the project's python.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
exec tools/python3 bench/tp_plan_bench_test.py
