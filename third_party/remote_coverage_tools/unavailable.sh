#!/bin/sh
echo "orthoshard: coverage tools are not available offline (third_party/remote_coverage_tools)" >&2
exit 1
