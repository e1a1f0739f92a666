#!/usr/bin/env bash
# Installs, on Debian or Ubuntu, what building tidepool needs ("build") or
# what its whole test suite needs ("test"). Installs nothing that is already
# there; uses sudo when not root.
set -euo pipefail
want=(build-essential cmake ninja-build zlib1g-dev)
if [ "${1:-build}" = test ]; then
  # clang: sanitizer builds and libFuzzer; xmllint: the SVG check.
  want+=(clang libclang-rt-14-dev libxml2-utils)
fi
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "deps: missing ${missing[*]} and no apt-get here; install them by hand" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
