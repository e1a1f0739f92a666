#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks that the library's components call only downward: builds the
# static call graph of src/*.c with gcc -fcallgraph-info (at -O0, so calls
# through inline helpers count where the helper lives) and checks every
# edge between two components against their ranks below. Indirect calls are
# listed by what they call through: the device table and the backing table
# (downward by construction), the range allocator's merge hook (the one
# call into a component above, given by the owner at init) and the user's
# callbacks (log, host allocator, reclaim); the CUDA backend calls the
# driver through the entry points it loaded, and two helpers take a visitor
# from their own file.
#   scripts/check_layers.sh [source-dir]     (needs gcc >= 10)
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Rank of each component; a component may call its own rank or lower.
rank_of() {
  case "$1" in
    src/stats_format.c) echo 85 ;; # text of both pools' and caches' figures
    src/graph_cache.c) echo 80 ;;
    src/pool.c|src/pool_pins.c|src/pool_inspect.c|src/pool_object.h) echo 70 ;;
    src/oom_ladder.[ch]) echo 60 ;;
    src/front_cache.[ch]) echo 50 ;;
    src/backing_vmm.c|src/backing_segment.c|src/pool_core.h) echo 40 ;;
    src/units.[ch]) echo 30 ;;
    src/stream_order.[ch]) echo 20 ;;
    src/pool_stats.h) echo 15 ;;
    src/range_alloc.[ch]) echo 10 ;;
    src/device.c|src/sim_device.c|src/sim_hooks.c|src/sim_internal.h|src/cuda_device.c) echo 5 ;;
    common/tpi_map.h) echo 1 ;;
    src/common.c|src/internal.h|src/text_out.h|include/*) echo 0 ;;
    *) echo -1 ;;
  esac
}

for f in "$root"/src/*.c; do
  gcc -std=c11 -D_GNU_SOURCE -O0 -I"$root/include" -I"$root/src" -I"$root/common" \
      -fcallgraph-info -c "$f" -o "$work/$(basename "$f" .c).o" -dumpdir "$work/"
done

# Every function defined anywhere, by node title (static functions carry
# their translation unit in the title) and, for global ones, by name.
awk -v root="$root/" '
  /^node:/ && !/shape : ellipse/ {
    match($0, /title: "[^"]*"/); t = substr($0, RSTART + 8, RLENGTH - 9)
    match($0, /label: "[^"]*"/); lab = substr($0, RSTART + 8, RLENGTH - 9)
    split(lab, parts, "\\\\n"); loc = parts[2]
    sub(/:[0-9]+:[0-9]+$/, "", loc); sub(root, "", loc)
    print "T", t, loc
    if (t !~ /:/) print "N", parts[1], loc
  }' "$work"/*.ci | sort -u > "$work/defs"

# Every edge: caller file, callee file (by definition), call site.
awk -v root="$root/" '
  FNR == NR { if ($1 == "T") bytitle[$2] = $3; else byname[$2] = $3; next }
  /^node:/ {
    match($0, /title: "[^"]*"/); t = substr($0, RSTART + 8, RLENGTH - 9)
    match($0, /label: "[^"]*"/); lab = substr($0, RSTART + 8, RLENGTH - 9)
    split(lab, parts, "\\\\n"); name[t] = parts[1]
  }
  /^edge:/ {
    match($0, /sourcename: "[^"]*"/); s = substr($0, RSTART + 13, RLENGTH - 14)
    match($0, /targetname: "[^"]*"/); d = substr($0, RSTART + 13, RLENGTH - 14)
    match($0, /label: "[^"]*"/); site = substr($0, RSTART + 8, RLENGTH - 9); sub(root, "", site)
    sf = bytitle[s]
    df = (d == "__indirect_call") ? "INDIRECT" : ((d in bytitle) ? bytitle[d] : byname[name[d]])
    if (sf != "" && df != "") print sf, df, name[s], (d == "__indirect_call" ? "*" : name[d]), site
  }' "$work/defs" "$work"/*.ci | sort -u > "$work/edges"

bad=0 edges=0 indirect=0
while read -r from to caller callee site; do
  edges=$((edges + 1))
  if [ "$to" = INDIRECT ]; then
    indirect=$((indirect + 1))
    file=${site%%:*}; line=$(echo "$site" | cut -d: -f2)
    text=$(sed -n "${line}p" "$root/$file")
    case "$file:$text" in
      src/cuda_device.c:*) ;; # the driver's entry points, loaded at run time
      *"visit("*|*"filter("*) ;; # a helper's visitor, from the same file
      *"ops->"*|*"->merge("*|*"->fn("*|*"observer.fn("*|*"local[i].fn("*|*"allocator."*|*"->allocator"*|*"host->"*|*"api."*|*"cu->api"*) ;;
      *) echo "unclassified indirect call in $caller at $site: $text"; bad=1 ;;
    esac
    continue
  fi
  [ "$from" = "$to" ] && continue
  rf=$(rank_of "$from"); rt=$(rank_of "$to")
  if [ "$rf" -lt 0 ] || [ "$rt" -lt 0 ]; then
    echo "no rank for $from or $to ($caller -> $callee at $site)"; bad=1
  elif [ "$rf" -lt "$rt" ]; then
    echo "upward call: $caller ($from) -> $callee ($to) at $site"; bad=1
  fi
done < "$work/edges"
[ "$bad" = 0 ] || exit 1
echo "layers: $edges call edges, every direct one downward; $indirect indirect calls through the device or backing table, the merge hook or user callbacks"
