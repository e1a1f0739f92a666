#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks that a shared libtidepool exports exactly the functions the public
# headers declare with TP_API (include/*.h), no more and no fewer.
#   scripts/check_exports.sh path/to/libtidepool.so [include-dir]
set -euo pipefail
lib=$1
inc=${2:-"$(dirname "$0")/../include"}
declared=$(sed -n 's/^TP_API[^(]*[ *]\(tp_[a-z0-9_]*\)(.*/\1/p' "$inc"/*.h | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWw]$/ {print $3}' | sort -u)
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$extra" ] || [ -n "$missing" ]; then
  [ -z "$extra" ] || printf 'exported but not declared in include/*.h:\n%s\n' "$extra"
  [ -z "$missing" ] || printf 'declared in include/*.h but not exported:\n%s\n' "$missing"
  exit 1
fi
echo "exports: $(echo "$exported" | wc -l) functions, exactly those declared in include/*.h"
