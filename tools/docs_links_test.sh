#!/usr/bin/env bash
# Runs docs_links_test.py on the source tree this script lives in (resolved through the runfiles
# symlink: the test reads every page and BUILD file, which no sandbox lists as data).
set -euo pipefail
here="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
exec python3 "$here/docs_links_test.py" "$(cd "$here/.." && pwd)"
