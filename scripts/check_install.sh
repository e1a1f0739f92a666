#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks that tidepool installs and links the way the README says, in
# temporary directories (nothing is written to the source tree):
#   1. the library alone (no tests, tools or PyTorch shim) configures with C
#      only and without zlib, builds, and `cmake --install --prefix` puts the
#      headers, libtidepool.a, libtidepool.so -> .so.0 -> .so.0.1.0 (soname
#      libtidepool.so.0), tidepool.pc and the CMake package there, with no
#      path of the source or build tree in them; the shared library exports
#      tp_* functions only, exactly those include/*.h declares;
#   2. examples/consumer builds against that prefix with find_package()
#      (shared and static) and with pkg-config, and each binary runs;
#   3. examples/consumer builds with tidepool added by add_subdirectory():
#      no C++, no zlib, no -Werror, no tests;
#   4. with the tools on, the install has bin/tide, and it runs.
#   scripts/check_install.sh        (needs cmake, a C compiler, pkg-config, make, zlib)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
checks=0
say() { echo "== check_install: $*"; }
ok() { checks=$((checks + 1)); }
fail() { echo "check_install: FAIL: $*" >&2; exit 1; }
bash "$root/scripts/deps.sh" install
version=$(sed -n 's/^project(tidepool VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
major=${version%%.*}
[ -n "$version" ] || fail "no project(tidepool VERSION ...) in CMakeLists.txt"

# ------------------------------------------------ 1. the library alone
say "library alone: configure, build, install"
lib_build=$work/build-lib prefix=$work/prefix
cmake -S "$root" -B "$lib_build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DTP_BUILD_TESTS=OFF -DTP_BUILD_TOOLS=OFF -DTP_BUILD_TORCH_SHIM=OFF -DTP_BUILD_GGML_ADAPTER=OFF >"$work/lib-configure.log"
grep -q '^CMAKE_CXX_COMPILER:' "$lib_build/CMakeCache.txt" && fail "the library alone enabled C++"; ok
grep -q '^ZLIB_' "$lib_build/CMakeCache.txt" && fail "the library alone looked for zlib"; ok
cmake --build "$lib_build" >"$work/lib-build.log" || { cat "$work/lib-build.log"; fail "library build"; }
# Installed somewhere else than configured: the package must be relocatable.
cmake --install "$lib_build" --prefix "$prefix" >"$work/lib-install.log"

pc=$(find "$prefix" -name tidepool.pc)
[ -n "$pc" ] || fail "no tidepool.pc under $prefix"; ok
libdir=$(dirname "$(dirname "$pc")")
for f in include/tidepool.h include/tidepool_sim.h; do
  [ -f "$prefix/$f" ] || fail "missing $f"; ok
done
cmp -s "$root/include/tidepool.h" "$prefix/include/tidepool.h" || fail "installed tidepool.h differs from include/tidepool.h"; ok
[ -f "$libdir/libtidepool.a" ] || fail "missing libtidepool.a in $libdir"; ok
[ -f "$libdir/libtidepool.so.$version" ] || fail "missing libtidepool.so.$version"; ok
[ "$(readlink "$libdir/libtidepool.so.$major")" = "libtidepool.so.$version" ] || fail "libtidepool.so.$major is not a link to libtidepool.so.$version"; ok
[ "$(readlink "$libdir/libtidepool.so")" = "libtidepool.so.$major" ] || fail "libtidepool.so is not a link to libtidepool.so.$major"; ok
soname=$(objdump -p "$libdir/libtidepool.so.$version" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libtidepool.so.$major" ] || fail "SONAME is '$soname', not libtidepool.so.$major"; ok
[ ! -e "$prefix/bin/tide" ] || fail "tide installed although TP_BUILD_TOOLS=OFF"; ok
for f in tidepoolConfig.cmake tidepoolConfigVersion.cmake tidepoolTargets.cmake; do
  [ -f "$libdir/cmake/tidepool/$f" ] || fail "missing $libdir/cmake/tidepool/$f"; ok
done
if grep -rlF -e "$root" -e "$lib_build" -e "$prefix" "$libdir/cmake" "$pc"; then
  fail "the installed CMake package or tidepool.pc names the source, build or install directory (above)"
fi; ok
exported=$(nm -D --defined-only "$libdir/libtidepool.so.$version" | awk '$2 ~ /^[TtWwDdBbRrVvi]$/ {print $3}')
[ -n "$exported" ] || fail "libtidepool.so exports nothing"
others=$(echo "$exported" | grep -v '^tp_' || true)
[ -z "$others" ] || fail "libtidepool.so exports symbols other than tp_*: $(echo $others)"; ok
bash "$root/scripts/check_exports.sh" "$libdir/libtidepool.so.$version" "$prefix/include" >/dev/null \
  || { bash "$root/scripts/check_exports.sh" "$libdir/libtidepool.so.$version" "$prefix/include" || true; fail "exports differ from the installed headers"; }; ok

# ------------------------------------------------ 2. consumers of the install
check_run() { # what, binary
  local out
  out=$("$2") || fail "$1: the consumer failed"
  # Tests on variables, not `echo | head | grep -q`: under pipefail such a
  # pipeline fails at random when the reader exits before echo's last write
  # (SIGPIPE; bash writes a multi-line echo one line at a time).
  local first_line=${out%%$'\n'*}
  [ "$first_line" = "tidepool $version (tp_version $(awk -F. '{print $1*10000 + $2*100 + $3}' <<<"$version"), header $version)" ] \
    || fail "$1: unexpected version line: $first_line"
  [[ $out == *'"allocs":24,"frees":24'* ]] || fail "$1: the stats JSON does not count 24 allocs and 24 frees"
  ok
}
for target in tidepool::tidepool tidepool::tidepool_static; do
  say "consumer with find_package(tidepool), $target"
  dir=$work/consumer-${target#tidepool::}
  cmake -S "$root/examples/consumer" -B "$dir" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
        -DTIDEPOOL_TARGET="$target" >"$dir.log" 2>&1 || { cat "$dir.log"; fail "consumer configure ($target)"; }
  cmake --build "$dir" >>"$dir.log" 2>&1 || { cat "$dir.log"; fail "consumer build ($target)"; }
  check_run "find_package, $target" "$dir/consumer"
  needs=$(objdump -p "$dir/consumer" | awk '$1 == "NEEDED" {print $2}')
  if [ "$target" = tidepool::tidepool ]; then
    grep -qx "libtidepool.so.$major" <<<"$needs" || fail "the consumer does not load libtidepool.so.$major"
  else
    grep -q libtidepool <<<"$needs" && fail "the static consumer loads libtidepool"
  fi; ok
done

say "consumer with pkg-config (make)"
cp -r "$root/examples/consumer" "$work/consumer-pc"
rm -f "$work/consumer-pc/consumer"
PKG_CONFIG_PATH="$libdir/pkgconfig" make -s -C "$work/consumer-pc" >"$work/consumer-pc.log" 2>&1 \
  || { cat "$work/consumer-pc.log"; fail "consumer build with pkg-config"; }
check_run "pkg-config" "$work/consumer-pc/consumer"
[ "$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --modversion tidepool)" = "$version" ] || fail "pkg-config --modversion"; ok
static_libs=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --static --libs tidepool)
grep -q -- '-lpthread' <<<"$static_libs" || fail "pkg-config --static lacks -lpthread"; ok

# ------------------------------------------------ 3. add_subdirectory()
say "consumer with add_subdirectory(tidepool)"
sub=$work/consumer-sub
cmake -S "$root/examples/consumer" -B "$sub" "${gen[@]}" -DTIDEPOOL_SOURCE_DIR="$root" >"$sub.log" 2>&1 \
  || { cat "$sub.log"; fail "add_subdirectory consumer configure"; }
grep -q '^CMAKE_CXX_COMPILER:' "$sub/CMakeCache.txt" && fail "add_subdirectory(tidepool) enabled C++"; ok
grep -q '^ZLIB_' "$sub/CMakeCache.txt" && fail "add_subdirectory(tidepool) looked for zlib"; ok
grep -qx 'TP_WERROR:BOOL=OFF' "$sub/CMakeCache.txt" || fail "add_subdirectory(tidepool) has TP_WERROR on"; ok
grep -qx 'TP_BUILD_TESTS:BOOL=OFF' "$sub/CMakeCache.txt" || fail "add_subdirectory(tidepool) builds the tests"; ok
cmake --build "$sub" -v >>"$sub.log" 2>&1 || { cat "$sub.log"; fail "add_subdirectory consumer build"; }
grep -q -- '-Werror' "$sub.log" && fail "add_subdirectory(tidepool) compiles with -Werror"; ok
check_run "add_subdirectory" "$sub/consumer"

# ------------------------------------------------ 4. the tool
say "library and tools: configure, build, install"
tools_build=$work/build-tools prefix2=$work/prefix-tools
cmake -S "$root" -B "$tools_build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DTP_BUILD_TESTS=OFF -DTP_BUILD_TOOLS=ON -DTP_BUILD_TORCH_SHIM=OFF >"$work/tools-configure.log"
cmake --build "$tools_build" >"$work/tools-build.log" || { cat "$work/tools-build.log"; fail "tools build"; }
cmake --install "$tools_build" --prefix "$prefix2" >"$work/tools-install.log"
[ -x "$prefix2/bin/tide" ] || fail "no bin/tide in the install with TP_BUILD_TOOLS=ON"; ok
"$prefix2/bin/tide" --help >/dev/null || fail "the installed tide --help failed"; ok

echo "check_install: $checks checks passed (tidepool $version: install, find_package, pkg-config, add_subdirectory, tide)"
