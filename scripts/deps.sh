#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Makes sure what building tidepool needs ("build", the default) or what its
# whole test suite needs ("test"; "install": only what scripts/check_install.sh
# needs) is there, and on Debian or Ubuntu installs what is not with apt-get.
#   scripts/deps.sh [build|install|test]
# It checks what each package provides (a command, a header that compiles, a
# sanitizer runtime that links), not the package database, so when all is
# there it installs nothing and needs no root, wherever the tools came from.
# To install it uses sudo when not root; when it cannot (no apt-get, or not
# root and no sudo) it names the packages to install and exits 1.
set -euo pipefail
mode=${1:-build}
case "$mode" in build|install|test) ;; *) echo "usage: scripts/deps.sh [build|install|test]" >&2; exit 2 ;; esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
links() { # compiler, flags...: compiles and links a small C program
  local cc=$1
  shift
  command -v "$cc" >/dev/null 2>&1 || return 1
  "$cc" -x c "$tmp/t.c" -x none "$@" -o "$tmp/t" >/dev/null 2>&1
}
clang_major() { clang -dumpversion 2>/dev/null | cut -d. -f1; }

missing=()
check() { # fills missing with the Debian/Ubuntu packages of what is absent
  missing=()
  local have_cc=1
  printf 'int main(void) { return 0; }\n' >"$tmp/t.c"
  links cc || { have_cc=0; missing+=(build-essential); }
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  printf '#include <zlib.h>\nint main(void) { return zlibVersion() == 0; }\n' >"$tmp/t.c"
  if [ "$have_cc" = 1 ] && ! links cc -lz; then missing+=(zlib1g-dev); fi
  [ "$mode" != build ] || return 0
  command -v make >/dev/null || missing+=(make)               # examples/consumer (check_install.sh)
  command -v pkg-config >/dev/null || missing+=(pkg-config)   # check_install.sh
  [ "$mode" = test ] || return 0
  command -v xmllint >/dev/null || missing+=(libxml2-utils)   # the SVG checks
  # the Python package, built and installed offline into a venv (Debian's python3)
  /usr/bin/python3 -c 'import setuptools, wheel, venv' >/dev/null 2>&1 || missing+=(python3-setuptools python3-wheel python3-venv)
  # the Prometheus text parsed by a real parser (Debian's python3)
  /usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 || python3 -c 'import prometheus_client' >/dev/null 2>&1 \
    || missing+=(python3-prometheus-client)
  if ! command -v clang >/dev/null; then
    missing+=(clang)                                          # sanitizer builds, libFuzzer
    return 0
  fi
  # clang's sanitizer and libFuzzer runtimes (compiler-rt), packaged apart
  # from clang on current Debian and Ubuntu: libclang-rt-<major>-dev.
  printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\nint LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; return (int)(n & 0); }\n' >"$tmp/t.c"
  local ok=1
  links clang -fsanitize=fuzzer,address,undefined || ok=0
  printf 'int main(void) { return 0; }\n' >"$tmp/t.c"
  links clang -fsanitize=thread || ok=0
  [ "$ok" = 1 ] || missing+=("libclang-rt-$(clang_major)-dev")
}

check
[ ${#missing[@]} -eq 0 ] && exit 0

cannot() { # why
  echo "deps: $1; install these packages (Debian/Ubuntu names) and run again: ${missing[*]}" >&2
  case " ${missing[*]} " in
    *" libclang-rt-"*|*" clang "*) echo "deps: clang must link -fsanitize=fuzzer,address,undefined and -fsanitize=thread: its compiler-rt runtime is libclang-rt-<clang major>-dev on Debian 12+ and Ubuntu 24.04+, part of libclang-common-<major>-dev on older releases" >&2 ;;
  esac
  exit 1
}
command -v apt-get >/dev/null || cannot "missing, and no apt-get here"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || cannot "missing, and not root and no sudo"
  sudo=(sudo)
fi
apt_install() {
  echo "deps: installing $*"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
    || cannot "apt-get install failed"
}
"${sudo[@]}" apt-get update -qq || cannot "apt-get update failed"
# clang's runtime package is named after the clang installed, so it comes
# after clang.
first=()
for p in "${missing[@]}"; do case "$p" in libclang-rt-*) ;; *) first+=("$p") ;; esac; done
[ ${#first[@]} -eq 0 ] || apt_install "${first[@]}"
check
for p in "${missing[@]}"; do
  case "$p" in
    libclang-rt-*)
      if apt-cache show "$p" >/dev/null 2>&1; then
        apt_install "$p"
      else
        cannot "clang $(clang_major) cannot link the sanitizer runtimes and apt knows no $p"
      fi ;;
  esac
done
check
[ ${#missing[@]} -eq 0 ] || cannot "still missing after apt-get"
