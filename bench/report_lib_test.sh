#!/bin/bash
# Runs the report generator's parsing/formatting test with the project's python.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
exec tools/python3 bench/report_lib_test.py
