#!/bin/sh
# SPDX-License-Identifier: MIT
# run_ctypes_test.sh TEST.py LIB.so SANITIZED [ARGS...] -- runs the ctypes
# test (python3 TEST.py LIB.so ARGS...), or skips (exit 77, CTest
# SKIP_RETURN_CODE) without python3 or in a sanitizer build (python3 cannot
# dlopen a sanitized library).
if ! command -v python3 >/dev/null 2>&1; then
  echo "SKIP: python3 not found"
  exit 77
fi
if [ "$3" = 1 ]; then
  echo "SKIP: sanitizer build (the C test covers the shim there)"
  exit 77
fi
test=$1 lib=$2
shift 3
exec python3 "$test" "$lib" "$@"
