#!/bin/bash
# Guards the choice documented in internal/gloo_backend.h: the translation unit compiled against
# Debian's (older) gloo headers must define no gloo or ProcessGroupGloo function, vtable or
# typeinfo, so nothing built from those headers can interpose the gloo inside libtorch_cpu.so.
set -euo pipefail
found=0
for lib in "$@"; do
  case "$lib" in *.a|*.so|*.pic.a) ;; *) continue ;; esac
  found=1
  bad=$(nm -C --defined-only "$lib" 2>/dev/null |
        sed -E 's/^[0-9a-f]+ [A-Za-z] //' |
        grep -E '^(gloo::|c10d::ProcessGroupGloo::|(vtable|typeinfo|typeinfo name|VTT) for (gloo::|c10d::ProcessGroupGloo))' || true)
  if [[ -n "$bad" ]]; then
    echo "FAIL: $lib defines gloo symbols compiled from Debian's headers:"
    echo "$bad"
    exit 1
  fi
  echo "ok: $lib defines no gloo or ProcessGroupGloo symbols"
done
if [[ $found -eq 0 ]]; then
  echo "FAIL: no library of :gloo_backend was given"
  exit 1
fi
