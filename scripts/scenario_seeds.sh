#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scenario_seeds.sh -- every `tide scenario` workload through one pool, over
# several seeds, so that a placement change is judged on more than the one
# draw each workload makes by default (a rule can win on seed 1 and lose on
# seed 2: docs/results.md has such cases). Prints, per workload, the mean and
# the worst peak held / peak live and the mean device calls; then the mean
# and worst over all workloads and the total calls. Optionally the same for
# trace files replayed once each.
#
#   scripts/scenario_seeds.sh [--tide PATH] [--pool POOL] [--seeds N] [--jobs N] [--length K] [--times] [TRACE...]
#
# POOL: vmm (default), segment, or a model of PyTorch's allocator to hold
# them against: torch-default or torch-expandable (tide replay --help).
# --length K runs every workload K times its default length (its --steps,
# else --rounds, --requests or --minutes; one with none of them, such as
# fa-decode, as it is): a peak that climbs with the run's length shows.
# --times adds a column: the pool's host time per event (tide's ns/event),
# the median over the runs. It varies from run to run, so the table is no
# longer the same from one sweep to the next; without it, it is. A
# workload whose time stands out is where the pool's own work is costly
# (placement once slid over given-back pages for most of it: docs/results.md).
#
# Workloads without a --seed parameter run once. image-requests runs on a
# 6 GiB device (VMM-capable for --pool vmm and torch-expandable), as its own
# default has no VMM.
set -euo pipefail

usage() { # the comment at the top, from its third line
    awk 'NR >= 3 && !/^#/ {exit} NR >= 3 {sub(/^# ?/, ""); print}' "$0"
}

tide=build/tide pool=vmm seeds=5 length=1 times=0 jobs=$(nproc 2>/dev/null || echo 2)
traces=()
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --tide) tide=${2:?--tide needs a path}; shift 2 ;;
    --pool) pool=${2:?--pool needs a pool name}; shift 2 ;;
    --seeds) seeds=${2:?--seeds needs a number}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    --length) length=${2:?--length needs a number}; shift 2 ;;
    --times) times=1; shift ;;
    -*) echo "scenario_seeds.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) traces+=("$1"); shift ;;
    esac
done
case $pool in vmm | segment | torch-default | torch-expandable) ;; *) echo "scenario_seeds.sh: --pool must be vmm, segment, torch-default or torch-expandable" >&2; exit 2 ;; esac
case $seeds in '' | *[!0-9]* | 0) echo "scenario_seeds.sh: --seeds must be a positive number" >&2; exit 2 ;; esac
case $jobs in '' | *[!0-9]* | 0) echo "scenario_seeds.sh: --jobs must be a positive number" >&2; exit 2 ;; esac
case $length in '' | *[!0-9]* | 0) echo "scenario_seeds.sh: --length must be a positive whole number" >&2; exit 2 ;; esac
[ -x "$tide" ] || { echo "scenario_seeds.sh: no tide at '$tide' (build it, or give --tide PATH)" >&2; exit 2; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The scenarios, as `tide scenario --help` lists them.
mapfile -t names < <("$tide" scenario --help | awk '/^scenarios and their parameters/ {on = 1; next}
    on && /^  [a-z]/ {print $1} on && /^options/ {exit}')
[ ${#names[@]} -gt 0 ] || { echo "scenario_seeds.sh: found no scenarios in 'tide scenario --help'" >&2; exit 1; }

# one NAME: a line "ratio calls" per run into $scratch/NAME, seeds 1..N
# where the listing gives the workload a --seed; a failed run (out of
# an error) is reported and fails the script. Out-of-memory failures are
# counted, not failures: high-water and oom-reclaim make them on purpose.
"$tide" scenario --help >"$scratch/help"
seeded() { awk -v n="$1" '$1 == n {on = 1; next} on && /^  [a-z]/ {exit} on && /--seed/ {print "yes"; exit}' "$scratch/help"; }
# The workload's length option at --length times its default ("--steps
# 15000"), or nothing for --length 1 and for a workload without one.
lengthened() {
    [ "$length" -eq 1 ] && return 0
    local opt
    for opt in steps rounds requests minutes; do
        awk -v n="$1" -v o="--$opt" -v k="$length" '$1 == n {on = 1; next} on && /^  [a-z]/ {exit}
            on && $1 == o {d = $NF; gsub(/[][]/, "", d); printf "%s %d\n", o, d * k; found = 1; exit}
            END {exit !found}' "$scratch/help" && return 0
    done
    return 0
}
one() {
    local name=$1 dev=() runs=(0)
    [ "$name" = image-requests ] && dev=(--device sim:6GiB)
    [ "$(seeded "$name")" = yes ] && runs=($(seq 1 "$seeds"))
    local longer
    read -ra longer <<<"$(lengthened "$name")"
    : >"$scratch/$name"
    for seed in "${runs[@]}"; do
        local args=(scenario "$name" --pool "$pool" "${dev[@]}" "${longer[@]}")
        [ "$seed" -gt 0 ] && args+=(--seed "$seed")
        echo "${args[*]}" >"$scratch/$name.args" # what ran, for the report
        if ! "$tide" "${args[@]}" >"$scratch/$name.out" 2>&1; then
            if grep -q "not pools" "$scratch/$name.out"; then # graph-churn drives a graph cache
                rm -f "$scratch/$name"
                return 0
            fi
            echo "scenario_seeds.sh: tide ${args[*]} failed:" >&2
            tail -5 "$scratch/$name.out" >&2
            return 1
        fi
        awk -v pool="$pool" '$1 == pool {print $7, $10, $11, $NF}' "$scratch/$name.out" >>"$scratch/$name"
    done
}

pids=() failed=0
for name in "${names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.05; done
    one "$name" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ $failed -eq 0 ] || exit 1

printf '%s pool, peak held / peak live over seeds 1..%s (one run where a workload has no seed)%s\n' "$pool" "$seeds" \
    "$([ "$length" -gt 1 ] && printf ', each %s times its default length' "$length")"
if [ "$length" -gt 1 ]; then
    for name in "${names[@]}"; do
        [ -f "$scratch/$name" ] || continue
        printf '%s %s; ' "$name" "$(grep -oE -- '--(steps|rounds|requests|minutes) [0-9]+' "$scratch/$name.args" || echo "(as it is)")"
    done | sed 's/; $//; s/^/lengths: /'
    echo
fi
printf '%-24s %6s %6s %6s %12s %6s' workload runs mean worst "mean calls" ooms
[ $times -eq 1 ] && printf ' %10s' "ns/event"
echo
# median of column 4 (ns/event) of a workload's runs, printed only with --times
median_time() { [ $times -eq 1 ] && sort -g -k4,4 "$1" | awk '{t[NR] = $4} END {printf " %10.1f", NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2}'; true; }
for name in "${names[@]}"; do
    [ -f "$scratch/$name" ] || continue
    awk -v n="$name" '{r += $1; c += $2; o += $3; if ($1 > w) w = $1; k++}
        END {printf "%-24s %6d %6.3f %6.3f %12.0f %6d", n, k, r / k, w, c / k, o}' "$scratch/$name"
    median_time "$scratch/$name"
    echo
done >"$scratch/table"
for trace in "${traces[@]}"; do
    "$tide" replay "$trace" --pool "$pool" >"$scratch/trace.out" 2>&1 ||
        { echo "scenario_seeds.sh: tide replay $trace failed" >&2; tail -5 "$scratch/trace.out" >&2; exit 1; }
    awk -v n="$(basename "$trace")" -v pool="$pool" -v times=$times '$1 == pool {printf "%-24s %6d %6.3f %6.3f %12.0f %6d", n, 1, $7, $7, $10, $11
        if (times) printf " %10.1f", $NF; printf "\n"}' "$scratch/trace.out"
done >>"$scratch/table"
cat "$scratch/table"
awk '{r += $3; if ($4 > w) w = $4; c += $5; o += $6; k++}
    END {printf "%-24s %6d %6.4f %6.3f %12.0f %6d (rows; mean of means; worst; total calls, ooms)\n", "all", k, r / k, w, c, o}' "$scratch/table"
