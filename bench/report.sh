#!/bin/bash
# bazel run //bench:report -- [--out=BENCHMARKS.md] [--repeats=N] [--quick] [--only=SECTIONS]
# Runs bench/report.py with the project's python (tools/python3: matplotlib for the plots) from the
# runfiles tree, where the benchmark binaries sit at their package paths.
set -euo pipefail
cd "${RUNFILES_DIR:-$0.runfiles}/orthoshard" 2>/dev/null || true
export PYTHONDONTWRITEBYTECODE=1
exec tools/python3 bench/report.py "$@"
