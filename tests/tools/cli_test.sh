#!/bin/sh
# SPDX-License-Identifier: MIT
# cli_test.sh -- the tide command line as a user meets it: help, usage errors
# (exit status 2 with a message naming the problem), malformed input (exit 1,
# the file and line named), scenario traces written and replayed, charts that
# parse as XML, and the demo.
#
# usage: cli_test.sh TIDE DATA_DIR SCRATCH_DIR XMLLINT GROUP
#   GROUP: usage | replay | scenario | svg | demo | observe | pickle
set -u
tide=$1 data=$2 scratch=$3 xmllint=$4 group=$5
mkdir -p "$scratch"
failures=0
out="$scratch/out.txt" err="$scratch/err.txt"

fail() {
    echo "FAIL: $*"
    echo "--- stdout:"; head -c 3000 "$out"
    echo "--- stderr:"; head -c 3000 "$err"
    failures=$((failures + 1))
}

# expect STATUS PATTERN COMMAND...: exit status STATUS and PATTERN (grep -E)
# somewhere in stdout or stderr.
expect() {
    status=$1 pattern=$2
    shift 2
    "$@" >"$out" 2>"$err"
    got=$?
    if [ "$got" -ne "$status" ]; then
        fail "$* exited $got, expected $status"
    elif ! cat "$out" "$err" | grep -Eq -- "$pattern"; then
        fail "$* did not print /$pattern/"
    fi
}

need_xmllint() {
    if [ ! -x "$xmllint" ] && ! command -v "$xmllint" >/dev/null 2>&1; then
        echo "FAIL: xmllint not found ('$xmllint'): install it (Debian: apt-get install libxml2-utils)"
        exit 1
    fi
}

# svg_ok FILE: exists and parses as XML.
svg_ok() {
    if [ ! -s "$1" ]; then
        failures=$((failures + 1)); echo "FAIL: $1 was not written"
    elif ! "$xmllint" --noout "$1"; then
        failures=$((failures + 1)); echo "FAIL: $1 is not well-formed XML"
    fi
}

# written_matches_direct POOLS "REPLAY OPTIONS" SCENARIO [PARAMETERS...]: the
# scenario written with --out and replayed through POOLS (with the replay
# options that give the scenario's device) gives what replaying it directly
# gives, a non-zero peak live for every pool among the figures.
written_matches_direct() {
    pools=$1 replay_options=$2 name=$3
    shift 2
    expect 0 "wrote .*$name.csv.gz" "$tide" scenario "$@" --out "$scratch/$name.csv.gz"
    "$tide" scenario "$@" --pool "$pools" --json |
        sed 's/"scenario":"[^"]*",//; s/"ns_per_event":[0-9.]*,//' >"$scratch/direct.json"
    # $replay_options unquoted: its words are options
    "$tide" replay "$scratch/$name.csv.gz" $replay_options --pool "$pools" --json |
        sed 's/"trace":"[^"]*",//; s/"ns_per_event":[0-9.]*,//' >"$scratch/written.json"
    pool_count=$(echo "$pools" | tr ',' '\n' | wc -l)
    [ "$(grep -c '"peak_live_bytes":[1-9]' "$scratch/direct.json")" = "$pool_count" ] ||
        fail "$name: no peak live for every pool in the direct replay"
    cmp -s "$scratch/direct.json" "$scratch/written.json" ||
        { fail "$name: written trace replays differently"; diff "$scratch/direct.json" "$scratch/written.json"; }
}

case $group in
usage)
    expect 2 "usage: tide COMMAND" "$tide"
    expect 0 "replay.*scenario|scenario.*replay" "$tide" --help
    expect 0 "demo" "$tide" --help
    expect 2 "unknown command 'frobnicate'" "$tide" frobnicate
    # output that could not be written (a full disk) is an error, not a silent 0
    if [ -w /dev/full ]; then
        full_fails() {
            "$@" >/dev/full 2>"$err"
            got=$?
            [ "$got" -eq 1 ] || fail "$* >/dev/full exited $got, expected 1"
            grep -q "writing the output failed: No space left on device" "$err" || fail "$* >/dev/full: no message"
        }
        full_fails "$tide" --help
        full_fails "$tide" replay "$data/qwen2vl_excerpt.csv" --json
        full_fails "$tide" scenario fa-decode --context 300
    fi
    expect 2 "no trace file given" "$tide" replay
    expect 2 "unknown option '--bogus'" "$tide" replay "$data/qwen2vl_excerpt.csv" --bogus
    expect 2 "--limit needs a size" "$tide" replay "$data/qwen2vl_excerpt.csv" --limit 12XB
    expect 2 "--tick-ms needs a whole number" "$tide" replay "$data/qwen2vl_excerpt.csv" --tick-ms 0
    expect 0 "--tick-ms N" "$tide" replay --help
    expect 2 "takes --device, --json and --plot" "$tide" scenario graph-churn --tick-ms 1000
    expect 2 "--device needs a value" "$tide" replay "$data/qwen2vl_excerpt.csv" --device
    expect 2 "unknown pool 'nope'" "$tide" replay "$data/qwen2vl_excerpt.csv" --pool vmm,nope
    # the options a baseline ignores: a note for each baseline, none for tidepool's pools
    expect 0 "note: ggml-legacy ignores --limit, --tick-ms \(tidepool pools only\)" "$tide" replay "$data/qwen2vl_excerpt.csv" --pool segment,ggml-legacy --limit 8GiB --tick-ms 1000 --limit 8GiB
    grep -q "note: segment" "$err" && fail "a note for the segment pool"
    "$tide" replay "$data/qwen2vl_excerpt.csv" --pool segment,ggml-vmm >"$out" 2>"$err"
    [ -s "$err" ] && fail "a note on stderr without a tidepool-only option"
    # no pool, or one twice: usage errors, before the trace is opened
    expect 2 "--pool names no pool" "$tide" replay "$scratch/missing.csv" --pool ""
    expect 2 "--pool names no pool" "$tide" replay "$scratch/missing.csv" --pool ,
    expect 2 "pool 'vmm' named twice in --pool" "$tide" replay "$scratch/missing.csv" --pool vmm,segment,vmm
    expect 2 "pool 'segment' named twice in --pool" "$tide" scenario fa-decode --context 300 --pool segment,segment
    expect 2 "--idle-release-ms needs a whole number" "$tide" replay "$data/qwen2vl_excerpt.csv" --idle-release-ms soon
    expect 2 "cannot open device 'warp:9'" "$tide" replay "$data/qwen2vl_excerpt.csv" --device warp:9
    expect 0 "usage: tide replay" "$tide" replay --help
    expect 2 "usage: tide scenario" "$tide" scenario
    expect 2 "unknown scenario 'nope'" "$tide" scenario nope
    expect 2 "fa-decode takes no --requests" "$tide" scenario fa-decode --requests 3
    expect 2 "--context needs a whole number" "$tide" scenario fa-decode --context 12k
    expect 2 "--context must be at least" "$tide" scenario image-requests --context 100
    expect 2 "--out writes the trace; --pool is for replaying" "$tide" scenario fa-decode --out "$scratch/x.csv" --pool vmm
    expect 2 "unknown option '--bogus'" "$tide" demo --bogus
    expect 2 "--requests needs a whole number" "$tide" demo --requests 0
    expect 0 "usage: tide demo" "$tide" demo --help
    # --help lists every scenario with its parameters
    expect 0 "usage: tide scenario" "$tide" scenario --help
    for name in fa-decode size-rotation oom-reclaim high-water out-of-order cross-stream image-requests mixed-lifetimes kv-realloc batched-serving heavy-tail phases training diffusion moe sawtooth spec-decode; do
        grep -q "^  $name " "$out" || fail "tide scenario --help does not list $name"
    done
    for param in --context --requests --steps --rounds --minutes --seed; do
        grep -q -- "$param N" "$out" || fail "tide scenario --help does not list $param"
    done
    # bench: the floor and the threads figures, positive numbers (no speed targets here)
    expect 0 '"threads_pairs_per_s":' "$tide" bench --runs 1 --pairs 20000 --threads 2 --json
    for key in same_size same_4k random; do
        sed -n "s/.*\"floor_ns_per_pair\":{[^}]*\"$key\":\([0-9.]*\).*/\1/p" "$out" | grep -Eq '^0*[1-9][0-9]*(\.[0-9]*)?$|^0*\.0*[1-9]' ||
            fail "tide bench --json: floor_ns_per_pair.$key is not a positive number"
    done
    # --threads is capped at the online CPUs
    for n in 1 $([ "$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)" -ge 2 ] && echo 2); do
        sed -n "s/.*\"threads_pairs_per_s\":{[^}]*\"$n\":\([0-9.]*\).*/\1/p" "$out" | grep -Eq '^0*[1-9]' ||
            fail "tide bench --json: threads_pairs_per_s.\"$n\" is not a positive number"
        for key in threads_speedup threads_own_pools_pairs_per_s threads_own_pools_speedup threads_shared_over_own; do
            sed -n "s/.*\"$key\":{[^}]*\"$n\":\([0-9.]*\).*/\1/p" "$out" | grep -Eq '^0*[1-9]|^0*\.0*[1-9]' ||
                fail "tide bench --json: $key.\"$n\" is not a positive number"
        done
    done
    for key in same_size same_4k random; do
        sed -n "s/.*\"floor_ratio\":{[^}]*\"$key\":\([0-9.]*\).*/\1/p" "$out" | grep -Eq '^0*[1-9]|^0*\.0*[1-9]' ||
            fail "tide bench --json: floor_ratio.$key is not a positive number"
    done
    expect 2 "--threads must be" "$tide" bench --threads 0
    # bench's counts: a message for 0 bytes, no trailing junk, no -1 read as 2^64 - 1 pairs (ran forever)
    expect 2 "--size needs at least 1 byte" "$tide" bench --size 0
    expect 2 "--pairs needs a whole number from 1 to" "$tide" bench --pairs 1000x --runs 1
    expect 2 "--runs needs a whole number from 1 to 64, got '2y'" "$tide" bench --pairs 1000 --runs 2y
    expect 2 "--pairs needs a whole number from 1 to" "$tide" bench --pairs -1 --runs 1
    ;;
replay)
    expect 0 "peak live" "$tide" replay "$data/qwen2vl_excerpt.csv" "$data/qwen2vl_excerpt.csv.gz" --pool vmm,segment
    # the same events in both formats and compressions give the same figures
    for f in qwen2vl_excerpt.csv qwen2vl_excerpt.csv.gz qwen2vl_excerpt.rmm.csv; do
        "$tide" replay "$data/$f" --pool segment,ggml-legacy --json |
            sed 's/"trace":"[^"]*",//; s/"ns_per_event":[0-9.]*,//' >"$scratch/$f.json" || fail "replay $f"
    done
    cmp -s "$scratch/qwen2vl_excerpt.csv.json" "$scratch/qwen2vl_excerpt.csv.gz.json" || fail "gzip and plain replays differ"
    cmp -s "$scratch/qwen2vl_excerpt.csv.json" "$scratch/qwen2vl_excerpt.rmm.csv.json" || fail "RMM and CSV replays differ"
    # one thread or several, plain or zlib-streamed gzip: the same figures
    for t in 1 3; do
        for f in qwen2vl_excerpt.csv qwen2vl_excerpt.csv.gz; do
            TIDE_INFLATE=zlib "$tide" replay "$data/$f" --pool segment,ggml-legacy --json --threads $t |
                sed 's/"trace":"[^"]*",//; s/"ns_per_event":[0-9.]*,//' >"$scratch/$f.t$t.json" || fail "replay $f --threads $t"
            cmp -s "$scratch/qwen2vl_excerpt.csv.json" "$scratch/$f.t$t.json" || fail "$f --threads $t replays differently"
        done
    done
    expect 2 "--threads needs a whole number" "$tide" replay "$data/qwen2vl_excerpt.csv" --threads 0
    expect 0 "events in [0-9.]+ s end to end, [0-9.]+M events/s, 3 threads: opening" "$tide" replay "$data/qwen2vl_excerpt.csv" --threads 3
    # frees of addresses allocated before the window: counted, not fatal
    expect 0 '"unknown_frees":[1-9]' "$tide" replay "$data/gemma3_window.csv" --json
    # a trace cut from a longer recording starts with frees (F2: the first
    # event a free crashed the replay): counted as unknown, exit 0
    printf 'time_us,action,addr,size,stream\n0,free,4096,0,0\n' >"$scratch/free_first.csv"
    expect 0 '"unknown_frees":1,' "$tide" replay "$scratch/free_first.csv" --json --pool vmm,segment,ggml-legacy,ggml-vmm,torch-default,torch-expandable
    [ "$(grep -c '"unknown_frees":1,' "$out")" -eq 6 ] || fail "free_first.csv: not every pool counted the unknown free"
    printf 'time_us,action,addr,size,stream\n0,free,4096,0,0\n1,free,0xffffffffffffffff,8,3\n2,free,0,8,0\n3,alloc,8192,100,0\n4,free,8192,100,0\n' |
        gzip >"$scratch/frees_first.csv.gz"
    expect 0 '"unknown_frees":3,' "$tide" replay "$scratch/frees_first.csv.gz" --json --pool vmm,segment,ggml-legacy,ggml-vmm,torch-default,torch-expandable
    [ "$(grep -c '"unknown_frees":3,' "$out")" -eq 6 ] || fail "frees_first.csv.gz: not every pool counted 3 unknown frees"
    expect 0 "3 frees of addresses the trace never allocated" "$tide" replay "$scratch/frees_first.csv.gz" --plot "$scratch/frees_first.svg"
    # a request near 2^64: ggml-vmm's rounding up wrapped and it "succeeded"
    # (16384 PiB live in 2 MiB held); it is past the pool's address space
    printf 'time_us,action,addr,size,stream\n1,alloc,256,18446744073709551615,0\n2,alloc,512,4096,0\n' >"$scratch/huge.csv"
    expect 0 "aborted at event 1: a request of 16384.00 PiB does not fit the pool's 32.00 GiB" "$tide" replay "$scratch/huge.csv" --pool ggml-vmm
    # the models of PyTorch's allocator: an out-of-memory failure, then the next request served
    expect 0 '"allocs":2,.*"ooms":1,"errors":0,' "$tide" replay "$scratch/huge.csv" --json --pool torch-default,torch-expandable
    [ "$(grep -c '"allocs":2,.*"ooms":1,"errors":0,' "$out")" -eq 2 ] || fail "huge.csv: a PyTorch model did not fail the request alone"
    # ggml-legacy's 1.05x look-ahead of it: a double past 2^64 converted (undefined; UBSan stops)
    expect 0 "aborted at event 1: cudaMalloc of 16384.00 PiB \(request 16384.00 PiB x 1.05\) failed" "$tide" replay "$scratch/huge.csv" --pool ggml-legacy
    # a zero-byte alloc is live until freed (its free was counted unknown) and
    # frees nothing (its slot must not keep the block freed before it: a double free)
    printf 'time_us,action,addr,size,stream\n1,alloc,256,4096,0\n2,free,256,0,0\n3,alloc,256,0,0\n4,free,256,0,0\n5,free,256,0,0\n' >"$scratch/zero.csv"
    expect 0 '"errors":0,"unknown_frees":1,' "$tide" replay "$scratch/zero.csv" --json --pool vmm,segment,ggml-legacy,ggml-vmm,torch-default,torch-expandable
    [ "$(grep -c '"errors":0,"unknown_frees":1,' "$out")" -eq 6 ] || fail "zero.csv: not every pool counted one unknown free and no error"
    # an alloc of an address already live: counted, and the older block (the
    # trace never freed it) freed first; it leaked (peak live 3 MiB, not 2)
    printf 'time_us,action,addr,size,stream\n1,alloc,256,1048576,0\n2,alloc,256,2097152,0\n3,free,256,0,0\n4,alloc,512,4096,0\n' >"$scratch/dup_alloc.csv"
    expect 0 '"peak_live_bytes":2097152,.*"errors":0,"unknown_frees":0,"duplicate_allocs":1,' "$tide" replay "$scratch/dup_alloc.csv" --json --pool vmm,segment,ggml-legacy,ggml-vmm,torch-default,torch-expandable
    [ "$(grep -c '"peak_live_bytes":2097152,.*"errors":0,"unknown_frees":0,"duplicate_allocs":1,' "$out")" -eq 6 ] || fail "dup_alloc.csv: not every pool freed the older block and counted it"
    expect 0 "1 allocs of addresses already live" "$tide" replay "$scratch/dup_alloc.csv"
    # --release-threshold 0 keeps nothing idle and --idle-release-ms 0 releases
    # at once (0 was the library's default: 16 MiB kept, 10 s): 20 MiB and 66 MiB held at the end
    printf 'time_us,action,addr,size,stream\n0,alloc,4096,8388608,0\n1000,free,4096,0,0\n20000000,alloc,8192,4096,0\n20001000,alloc,16384,4096,0\n' >"$scratch/idle_small.csv"
    expect 0 '"end_reserved_bytes":2097152,' "$tide" replay "$scratch/idle_small.csv" --pool segment --json --release-threshold 0
    printf 'time_us,action,addr,size,stream\n0,alloc,4096,67108864,0\n1000,free,4096,0,0\n2000000,alloc,8192,4096,0\n2001000,alloc,16384,4096,0\n' >"$scratch/idle_big.csv"
    expect 0 '"end_reserved_bytes":2097152,' "$tide" replay "$scratch/idle_big.csv" --pool segment --json --idle-release-ms 0
    # 70 streams: the 7 past the 63 a replay creates run on the default
    # stream, counted and said (they were folded silently)
    i=1; { echo 'time_us,action,addr,size,stream'; while [ $i -le 70 ]; do
        echo "$((2 * i)),alloc,$((i * 4096)),1024,$i"; echo "$((2 * i + 1)),free,$((i * 4096)),1024,$i"; i=$((i + 1)); done; } >"$scratch/streams70.csv"
    expect 0 '"folded_streams":7,' "$tide" replay "$scratch/streams70.csv" --json --pool vmm,segment,ggml-legacy,ggml-vmm,torch-default,torch-expandable
    [ "$(grep -c '"folded_streams":7,' "$out")" -eq 6 ] || fail "streams70.csv: not every pool counted 7 folded streams"
    expect 0 "7 streams past the 63 a replay creates ran on the default stream" "$tide" replay "$scratch/streams70.csv"
    # a device spec of 88 characters (tp_device_open takes up to 255): whole in the JSON (cut at 63)
    long_spec="sim:$(printf '%080d' 0)1TiB"
    expect 0 "\"device\":\"$long_spec\"" "$tide" replay "$data/qwen2vl_excerpt.csv" --device "$long_spec" --pool segment --json
    # malformed files: exit 1, file and line named
    printf 'time_us,action,addr,size,stream\n1,alloc,1,2,0\n2,alloc,3,four,0\n' >"$scratch/bad.csv"
    expect 1 "bad.csv:3: bad size 'four'" "$tide" replay "$scratch/bad.csv"
    printf 'time,what\n' | gzip >"$scratch/bad_header.csv.gz"
    expect 1 "bad_header.csv.gz:1: unknown header" "$tide" replay "$scratch/bad_header.csv.gz"
    expect 1 "missing.csv: cannot open" "$tide" replay "$scratch/missing.csv"
    # damaged gzip traces (F9): exit 1 with the file named, no report
    # a good trace of 4000 events, then cut mid-stream and with bytes flipped
    i=0; { echo 'time_us,action,addr,size,stream'; while [ $i -lt 2000 ]; do
        echo "$i,alloc,$(((i + 1) * 4096)),$(((i % 97 + 1) * 256)),0"; echo "$i,free,$(((i + 1) * 4096)),0,0"; i=$((i + 1)); done; } |
        gzip >"$scratch/good.csv.gz"
    expect 0 "peak live" "$tide" replay "$scratch/good.csv.gz"
    size=$(wc -c <"$scratch/good.csv.gz")
    head -c $((size / 2)) "$scratch/good.csv.gz" >"$scratch/cut.csv.gz"
    expect 1 "cut.csv.gz:[0-9]+: truncated gzip file" "$tide" replay "$scratch/cut.csv.gz"
    grep -q "peak live" "$out" && fail "cut.csv.gz: a partial replay was reported"
    head -c $((size - 4)) "$scratch/good.csv.gz" >"$scratch/cut_trailer.csv.gz"
    expect 1 "cut_trailer.csv.gz:4002: truncated gzip file" "$tide" replay "$scratch/cut_trailer.csv.gz" --json
    grep -q "peak_live" "$out" && fail "cut_trailer.csv.gz: a partial replay was reported"
    cp "$scratch/good.csv.gz" "$scratch/flipped.csv.gz"
    printf '\132\132\132\132' | dd of="$scratch/flipped.csv.gz" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
    expect 1 "flipped.csv.gz:[0-9]+: " "$tide" replay "$scratch/flipped.csv.gz"
    grep -q "peak live" "$out" && fail "flipped.csv.gz: a partial replay was reported"
    cp "$scratch/good.csv.gz" "$scratch/bad_crc.csv.gz"
    printf '\000\000\000\000' | dd of="$scratch/bad_crc.csv.gz" bs=1 seek=$((size - 8)) conv=notrunc 2>/dev/null
    expect 1 "bad_crc.csv.gz:[0-9]+: corrupt gzip data" "$tide" replay "$scratch/bad_crc.csv.gz"
    # a damaged file among good ones: the good ones are reported, the exit is 1
    expect 1 "cut.csv.gz:[0-9]+: truncated" "$tide" replay "$scratch/good.csv.gz" "$scratch/cut.csv.gz"
    ;;
scenario)
    expect 0 "frees out of LIFO order" "$tide" scenario out-of-order --steps 100 --pool ggml-vmm
    expect 0 "ggml-legacy" "$tide" scenario fa-decode --context 2048 --pool segment,ggml-legacy
    # written then replayed gives what replaying directly gives
    written_matches_direct segment,ggml-legacy "--device sim:6GiB,novmm --occupy 3GiB" image-requests --requests 4
    # the ported shapes too, in fewer steps
    written_matches_direct vmm,segment "" batched-serving --steps 300
    written_matches_direct vmm,segment "" heavy-tail --steps 5000
    written_matches_direct vmm,segment "" phases --rounds 2
    written_matches_direct vmm,segment "" training --steps 20
    expect 0 "^time_us,action,addr,size,stream" "$tide" scenario cross-stream --steps 3 --out -
    # a tick a second, as the PyTorch shim's upkeep thread calls it, leaves a
    # busy pool's placement alone: same memory, same device calls
    for tick in "" "--tick-ms 1000"; do
        "$tide" scenario image-requests --requests 12 --device sim:6GiB --pool vmm,segment --json $tick |
            sed 's/"ns_per_event":[0-9.]*,//' >"$scratch/tick$([ -n "$tick" ] && echo 1).json"
    done
    [ -s "$scratch/tick.json" ] || fail "no JSON from image-requests"
    cmp -s "$scratch/tick.json" "$scratch/tick1.json" || { fail "ticks changed the replay"; diff "$scratch/tick.json" "$scratch/tick1.json"; }
    # graph-churn: the capped run holds the cap (plus one executable), the
    # uncapped one grows; both say so in JSON with the fields of the issue.
    expect 0 "cap 64 MiB .* no cap|hot re-inst" "$tide" scenario graph-churn --requests 400 --cap-mib 64
    expect 0 '"graph_exec_bytes_cap":67108864' "$tide" scenario graph-churn --requests 400 --cap-mib 64 --json
    cap_line=$(grep '"run":"cap"' "$out") nocap_line=$(grep '"run":"no-cap"' "$out")
    field() { printf '%s\n' "$1" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"; }
    for f in graph_exec_bytes_peak graph_evictions device_graph_bytes_peak hot_reinstantiations_after_warmup; do
        [ -n "$(field "$cap_line" $f)" ] || fail "graph-churn JSON lacks $f"
    done
    cap_peak=$(field "$cap_line" device_graph_bytes_peak) nocap_end=$(field "$nocap_line" device_graph_bytes_end)
    [ "${cap_peak:-999999999999}" -le $((80 * 1048576)) ] || fail "graph-churn capped at 64 MiB held $cap_peak bytes"
    [ "${nocap_end:-0}" -ge $((1024 * 1048576)) ] || fail "graph-churn without a cap held only $nocap_end bytes"
    [ "$(field "$cap_line" graph_evictions)" -gt 100 ] 2>/dev/null || fail "graph-churn capped run evicted too little"
    [ "$(field "$cap_line" hot_reinstantiations_after_warmup)" = 0 ] || fail "graph-churn evicted hot keys"
    # a cap smaller than a hot key's executable (about 4.7 MiB): hot keys and
    # requests alike run eagerly (TP_ERR_RUN_EAGER), counted, not an error
    expect 0 "cap 4 MiB .* [1-9][0-9]*$" "$tide" scenario graph-churn --requests 50 --cap-mib 4
    expect 0 '"eager_fallbacks":[1-9]' "$tide" scenario graph-churn --requests 50 --cap-mib 4 --json
    [ "$(grep -c '^{.*}$' "$out")" = 2 ] || fail "graph-churn --cap-mib 4 --json: not two JSON lines"
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import json, sys; [json.loads(l) for l in sys.stdin]' <"$out" ||
            fail "graph-churn --cap-mib 4 --json is not valid JSON"
    fi
    expect 2 "no trace to write" "$tide" scenario graph-churn --out "$scratch/gc.csv"
    expect 2 "takes --device, --json and --plot" "$tide" scenario graph-churn --pool vmm
    expect 2 "graph-churn takes no --steps" "$tide" scenario graph-churn --steps 3
    ;;
svg)
    need_xmllint
    # a title with markup characters (the file name)
    cp "$data/qwen2vl_excerpt.csv" "$scratch/a&b<c>'d'.csv"
    expect 0 "wrote" "$tide" replay "$scratch/a&b<c>'d'.csv" --pool vmm,segment,ggml-legacy,ggml-vmm --plot "$scratch/replay.svg"
    svg_ok "$scratch/replay.svg"
    expect 0 "wrote" "$tide" scenario high-water --minutes 1 --pool vmm,segment,ggml-legacy --plot "$scratch/scenario.svg"
    svg_ok "$scratch/scenario.svg"
    # F10: a path that is not a regular file is written through, not
    # replaced by a renamed temporary. A symbolic link to a file elsewhere:
    rm -rf "$scratch/elsewhere" "$scratch/link.svg" "$scratch/fifo.svg" "$scratch/adir.svg"
    rm -f "$scratch"/*.tmp*
    mkdir -p "$scratch/elsewhere"
    echo old >"$scratch/elsewhere/target.svg"
    ln -s "$scratch/elsewhere/target.svg" "$scratch/link.svg"
    expect 0 "wrote" "$tide" replay "$data/qwen2vl_excerpt.csv" --plot "$scratch/link.svg"
    [ -L "$scratch/link.svg" ] || fail "--plot replaced the symbolic link link.svg"
    svg_ok "$scratch/elsewhere/target.svg"
    # a FIFO, read by a background cat: it gets the SVG and stays a FIFO
    mkfifo "$scratch/fifo.svg"
    cat "$scratch/fifo.svg" >"$scratch/from_fifo.svg" &
    reader=$!
    expect 0 "wrote" "$tide" scenario fa-decode --context 300 --plot "$scratch/fifo.svg"
    waited=0
    while kill -0 "$reader" 2>/dev/null && [ "$waited" -lt 50 ]; do sleep 0.1; waited=$((waited + 1)); done
    if kill -0 "$reader" 2>/dev/null; then
        kill "$reader"; fail "--plot never wrote into the FIFO (the reader still waits)"
    fi
    wait "$reader" 2>/dev/null
    [ -p "$scratch/fifo.svg" ] || fail "--plot replaced the FIFO fifo.svg"
    svg_ok "$scratch/from_fifo.svg"
    # a regular file is replaced whole; a file named like the temporary is
    # someone else's and stays as it was
    echo mine >"$scratch/replay.svg.tmp"
    expect 0 "wrote" "$tide" replay "$data/qwen2vl_excerpt.csv" --plot "$scratch/replay.svg"
    svg_ok "$scratch/replay.svg"
    [ "$(cat "$scratch/replay.svg.tmp")" = mine ] || fail "--plot overwrote replay.svg.tmp"
    rm -f "$scratch/replay.svg.tmp"
    # failures leave no temporary behind
    mkdir "$scratch/adir.svg"
    expect 1 "adir.svg: cannot create" "$tide" replay "$data/qwen2vl_excerpt.csv" --plot "$scratch/adir.svg"
    expect 1 "cannot create" "$tide" scenario fa-decode --context 300 --plot "$scratch/no/such/dir/x.svg"
    for leftover in "$scratch"/*.tmp* "$scratch"/adir.svg/*; do
        [ -e "$leftover" ] && fail "a temporary was left behind: $leftover"
    done
    expect 0 "wrote" "$tide" scenario graph-churn --requests 200 --plot "$scratch/churn.svg"
    svg_ok "$scratch/churn.svg"
    ;;
demo)
    need_xmllint
    expect 0 "tidepool: no errors, no hazards, no out-of-memory failures" "$tide" demo --plot "$scratch/demo.svg"
    grep -q "ggml-legacy ABORTED at request" "$out" || fail "the demo does not tell when ggml-legacy aborted"
    grep -q "ggml-legacy ran out of device memory at token" "$out" || fail "the demo does not tell when ggml-legacy ran out"
    svg_ok "$scratch/demo.svg"
    # peak labels never overlap: any two of a panel are a line apart
    grep -o '<text x="[0-9.]*" y="[0-9.]*" font-size="11" fill="#[0-9a-f]*" stroke="#fff"[^>]*>[^<]*' "$scratch/demo.svg" |
        sed 's/<text x="\([0-9.]*\)" y="\([0-9.]*\)".*>/\1 \2 /' >"$scratch/labels.txt"
    [ "$(wc -l <"$scratch/labels.txt")" -ge 5 ] || fail "demo.svg: the peak labels were not found"
    awk '{ x[NR] = $1; y[NR] = $2 } END {
        for (i = 1; i <= NR; i++) for (j = i + 1; j <= NR; j++) {
            dy = y[i] - y[j]; if (dy < 0) dy = -dy; dx = x[i] - x[j]; if (dx < 0) dx = -dx
            if (dy < 12 && dx < 260) { print "overlap: " $0; bad = 1 }
        }
        exit bad }' "$scratch/labels.txt" || fail "demo.svg: two peak labels overlap"
    ;;
observe)
    need_xmllint
    trace="$data/qwen2vl_excerpt.csv"
    # --metrics: Prometheus text, one family per name, labels trace/pool
    expect 0 "wrote .*m.prom" "$tide" replay "$trace" "$data/qwen2vl_excerpt.csv.gz" --pool vmm,segment,ggml-legacy --metrics "$scratch/m.prom"
    grep -q '^tidepool_pool_reserved_bytes_peak{device="sim:0",kind="vmm",trace="qwen2vl_excerpt",pool="vmm"} [0-9]' "$scratch/m.prom" ||
        fail "m.prom: no reserved_bytes_peak sample for the vmm pool"
    grep -q '^tidepool_baseline_reserved_bytes_peak{trace="qwen2vl_excerpt",pool="ggml-legacy"} [0-9]' "$scratch/m.prom" ||
        fail "m.prom: no baseline figures for ggml-legacy"
    grep -q '^tidepool_replay_peak_live_bytes{trace="qwen2vl_excerpt",pool="segment"} 2077647440$' "$scratch/m.prom" ||
        fail "m.prom: wrong or missing peak live"
    [ "$(grep -c '^# TYPE tidepool_pool_reserved_bytes_peak ' "$scratch/m.prom")" = 1 ] || fail "m.prom: a family split in two"
    grep -q 'trace="qwen2vl_excerpt.csv.gz",pool="vmm"' "$scratch/m.prom" || fail "m.prom: two traces of one name share a label"
    # label values escaped: backslash, double quote, newline
    weird=$(printf '%s/a\\b"c\nd.csv' "$scratch")
    cp "$trace" "$weird"
    expect 0 "wrote" "$tide" replay "$weird" --pool segment --metrics "$scratch/weird.prom"
    grep -q 'trace="a\\\\b\\"c\\nd",pool="segment"' "$scratch/weird.prom" || fail "weird.prom: label value not escaped"
    rm -f "$weird"
    # parsed by prometheus_client where a python3 has it
    py=""
    for candidate in python3 /usr/bin/python3; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import prometheus_client' 2>/dev/null; then
            py=$candidate; break
        fi
    done
    if [ -n "$py" ]; then
        for f in m.prom weird.prom; do
            "$py" "$(dirname "$0")/check_metrics.py" "$scratch/$f" trace segment >"$out" 2>"$err" || fail "prometheus_client refused $f"
        done
        "$tide" scenario fa-decode --context 2048 --pool vmm,segment,ggml-vmm --metrics "$scratch/s.prom" >/dev/null || fail "scenario --metrics"
        "$py" "$(dirname "$0")/check_metrics.py" "$scratch/s.prom" scenario vmm segment ggml-vmm >"$out" 2>"$err" || fail "prometheus_client refused s.prom"
    else
        echo "note: no python3 with prometheus_client (Debian: python3-prometheus-client): metrics not parsed"
    fi
    # --snapshot and tide map
    expect 0 "wrote .*snap.segment.json" "$tide" replay "$trace" --pool vmm,segment,ggml-legacy --snapshot "$scratch/snap"
    for f in snap.vmm.json snap.vmm.end.json snap.segment.json snap.segment.end.json; do
        [ -s "$scratch/$f" ] || fail "--snapshot did not write $f"
    done
    [ -e "$scratch/snap.ggml-legacy.json" ] && fail "--snapshot wrote a map for a baseline"
    grep -q '"reserved_bytes":2168455168,' "$scratch/snap.segment.json" || fail "snap.segment.json is not the map at the peak"
    for f in snap.vmm snap.segment snap.segment.end; do
        expect 0 "wrote .*$f.svg" "$tide" map "$scratch/$f.json" --plot "$scratch/$f.svg"
        svg_ok "$scratch/$f.svg"
        grep -q "<title>$f.json</title>" "$scratch/$f.svg" || fail "$f.svg: not titled by the file's base name"
        for state in $(grep -o '"state":"[a-z_]*"' "$scratch/$f.json" | sort -u | cut -d'"' -f4); do
            grep -q "<g class=\"legend\">.*>$state: " "$scratch/$f.svg" || fail "$f.svg: state $state not in the legend"
        done
    done
    grep -q 'unmapped: .*rows compressed' "$scratch/snap.vmm.svg" || fail "snap.vmm.svg: the unmapped run is not compressed"
    # states this tide does not know: the file's names, escaped, each range its own
    printf '{"kind":"vmm","ranges":[{"address":4096,"bytes":4096,"state":"a<b&c"},{"address":8192,"bytes":4096,"state":"zz>"}]}' >"$scratch/states.json"
    expect 0 "wrote .*states.svg" "$tide" map "$scratch/states.json" --plot "$scratch/states.svg"
    svg_ok "$scratch/states.svg"
    grep -q '<title>0x1000 4.00 KiB, a&lt;b&amp;c</title>' "$scratch/states.svg" || fail "states.svg: the first range's state not escaped"
    grep -q '<title>0x2000 4.00 KiB, zz&gt;</title>' "$scratch/states.svg" || fail "states.svg: the second range not labelled with its own state"
    grep -q '>other states: 8.00 KiB in 2 ranges' "$scratch/states.svg" || fail "states.svg: the legend does not say other states"
    expect 2 "--plot OUT.svg is required" "$tide" map "$scratch/snap.vmm.json"
    expect 2 "--snapshot writes one trace" "$tide" replay "$trace" "$trace" --snapshot "$scratch/x"
    printf '{"kind":"vmm","ranges":[{"address":1,"bytes":}]}' >"$scratch/bad_map.json"
    expect 1 "bad_map.json: offset 45: expected a number" "$tide" map "$scratch/bad_map.json" --plot "$scratch/bad_map.svg"
    # --series: the chart's curves
    expect 0 "wrote .*series.csv" "$tide" replay "$trace" --pool vmm,segment --series "$scratch/series.csv"
    head -1 "$scratch/series.csv" | grep -q '^event,time_us,vmm_live_bytes,vmm_held_bytes,vmm_cached_bytes,segment_live_bytes,' ||
        fail "series.csv: unexpected header"
    [ "$(wc -l <"$scratch/series.csv")" -eq 301 ] || fail "series.csv: expected 300 rows"
    # gates: 3 when a gate fails, 0 when it holds; errors still 1
    expect 3 "gate failed \(--max-ratio 1.01\): .*pool segment held" "$tide" replay "$trace" --pool segment --max-ratio 1.01
    expect 0 "peak live" "$tide" replay "$trace" --pool segment --max-ratio 1.2
    printf 'time_us,action,addr,size,stream\n0,alloc,4096,2147483648,0\n1,alloc,8192,1024,0\n' >"$scratch/too_big.csv"
    expect 3 "gate failed \(--fail-on-oom\): .*too_big.csv: pool segment ran out of memory 1 time" "$tide" replay "$scratch/too_big.csv" --device sim:1GiB,novmm --pool segment --fail-on-oom
    expect 0 "peak live" "$tide" replay "$scratch/too_big.csv" --device sim:1GiB,novmm --pool segment
    expect 3 "gate failed \(--max-ratio 1.1\): fa-decode: pool segment held" "$tide" scenario fa-decode --context 2048 --pool segment --max-ratio 1.1
    expect 0 "segment" "$tide" scenario fa-decode --context 2048 --pool segment --fail-on-oom --max-ratio 1.6
    # small long-lived blocks among a growing buffer's segments (11.8x before
    # the segment pool kept requests apart from pinned segments; 1.30x after)
    expect 0 "segment" "$tide" scenario kv-realloc --pool vmm,segment --fail-on-oom --max-ratio 1.5
    # the ported shapes, each gated a little above what the worse pool holds
    # today (batched-serving segment 1.293, heavy-tail segment 1.492,
    # phases both 1.013, training segment 1.461)
    expect 0 "segment" "$tide" scenario batched-serving --pool vmm,segment --fail-on-oom --max-ratio 1.36
    expect 0 "segment" "$tide" scenario heavy-tail --pool vmm,segment --fail-on-oom --max-ratio 1.57
    expect 0 "segment" "$tide" scenario phases --pool vmm,segment --fail-on-oom --max-ratio 1.07
    expect 0 "segment" "$tide" scenario training --pool vmm,segment --fail-on-oom --max-ratio 1.54
    # diffusion, moe, sawtooth and spec-decode on both pools, each gate about 5% above the worse
    # pool's ratio when they were added (the segment pool's: diffusion 1.002, moe 1.025 (vmm's
    # too), sawtooth 1.574, spec-decode 1.237). Segment ladder steps of 25% instead of 6% fail
    # diffusion, sawtooth and spec-decode; medium segments of 200 MiB instead of 20 fail moe
    expect 0 "segment" "$tide" scenario diffusion --pool vmm,segment --fail-on-oom --max-ratio 1.06
    expect 0 "segment" "$tide" scenario moe --pool vmm,segment --fail-on-oom --max-ratio 1.08
    expect 0 "segment" "$tide" scenario sawtooth --pool vmm,segment --fail-on-oom --max-ratio 1.66
    expect 0 "segment" "$tide" scenario spec-decode --pool vmm,segment --fail-on-oom --max-ratio 1.30
    # the VMM pool where buffers move through the address space, on seeds that were at their
    # worst while its look-ahead could map past the hard cap (phases seed 2 1.214, heavy-tail
    # seed 4 1.119, spec-decode 1.124; 1.064, 1.065, 1.063 with it kept under the cap)
    expect 0 "vmm" "$tide" scenario phases --seed 2 --pool vmm --fail-on-oom --max-ratio 1.08
    expect 0 "vmm" "$tide" scenario heavy-tail --seed 4 --pool vmm --fail-on-oom --max-ratio 1.08
    expect 0 "vmm" "$tide" scenario spec-decode --pool vmm --fail-on-oom --max-ratio 1.08
    # training frees its activations and makes them again every step: the pool grows back below
    # its high-water mark, where the look-ahead stops at the soft cap (1.063 with the hard cap)
    expect 0 "vmm" "$tide" scenario training --pool vmm --fail-on-oom --max-ratio 1.04
    expect 2 "--max-ratio needs a ratio" "$tide" replay "$trace" --max-ratio 0.5
    expect 1 "missing.csv: cannot open" "$tide" replay "$scratch/missing.csv" --max-ratio 1.01
    expect 0 "3 = |3 a gate failed" "$tide" replay --help
    # device errors that say why
    expect 2 "cannot open device 'bogus': bad device spec 'bogus' \(try sim, sim:6GiB,novmm, cuda:0\)" "$tide" replay "$trace" --device bogus
    expect 2 "cannot open device 'cuda:99': .*(cannot load the CUDA driver|no such device|no CUDA device)" "$tide" replay "$trace" --device cuda:99
    # progress: only on a terminal (script gives one), never with --quiet or into a file
    "$tide" replay "$data/qwen2vl_dynres.head2000.csv.gz" >"$out" 2>"$err"
    [ -s "$err" ] && fail "replay into files wrote to stderr"
    if command -v script >/dev/null 2>&1; then
        TIDE_PROGRESS_AFTER_MS=0 script -qec "'$tide' replay '$data/qwen2vl_dynres.head2000.csv.gz'" /dev/null >"$out" 2>&1
        grep -q 'events.*ETA' "$out" || fail "no progress line on a terminal"
        TIDE_PROGRESS_AFTER_MS=0 script -qec "'$tide' replay '$data/qwen2vl_dynres.head2000.csv.gz' --quiet" /dev/null >"$out" 2>&1
        grep -q 'ETA' "$out" && fail "--quiet still showed progress"
    fi
    ;;
pickle)
    # PyTorch snapshots: the same events as the CSV replay to the same figures
    "$tide" replay "$data/qwen2vl_excerpt.csv" --pool vmm,segment,ggml-legacy --json |
        sed 's/"trace":"[^"]*",//; s/"ns_per_event":[0-9.]*,//' >"$scratch/csv.json"
    for f in qwen2vl_excerpt.pickle qwen2vl_excerpt.p5.pickle qwen2vl_excerpt.p2.pickle.gz; do
        "$tide" replay "$data/$f" --pool vmm,segment,ggml-legacy --json |
            sed 's/"trace":"[^"]*",//; s/"ns_per_event":[0-9.]*,//' >"$scratch/$f.json" || fail "replay $f"
        cmp -s "$scratch/csv.json" "$scratch/$f.json" || { fail "$f replays differently from the CSV"; diff "$scratch/csv.json" "$scratch/$f.json"; }
    done
    # A snapshot recorded on an H200 (scripts/gpu_torch_snapshot.py: torch 2.11, a small attention loop
    # and a conv layer) and the CSV the recorder's rule makes of it: the same trace.
    "$tide" replay "$data/h200_torch_snapshot.csv.gz" --pool vmm,segment --json |
        sed 's/"trace":"[^"]*",//; s/"ns_per_event":[0-9.]*,//' >"$scratch/h200_csv.json" || fail "replay the H200 CSV"
    "$tide" replay "$data/h200_torch_snapshot.pickle.gz" --pool vmm,segment --json |
        sed 's/"trace":"[^"]*",//; s/"ns_per_event":[0-9.]*,//' >"$scratch/h200_pickle.json" || fail "replay the H200 snapshot"
    cmp -s "$scratch/h200_csv.json" "$scratch/h200_pickle.json" || fail "the H200 snapshot replays differently from its CSV"
    grep -q '"events":781,' "$scratch/h200_pickle.json" || fail "the H200 snapshot has not its 781 alloc/free events"
    expect 0 '"events":4,.*"peak_live_bytes":3145728,' "$tide" replay "$data/qwen2vl_excerpt.pickle" --pt-device 1 --json --pool segment
    expect 1 "device 5 has no trace: the snapshot holds 2 devices" "$tide" replay "$data/qwen2vl_excerpt.pickle" --pt-device 5
    expect 2 "--pt-device needs a whole number" "$tide" replay "$data/qwen2vl_excerpt.pickle" --pt-device x
    size=$(wc -c <"$data/qwen2vl_excerpt.pickle")
    head -c $((size / 2)) "$data/qwen2vl_excerpt.pickle" >"$scratch/cut.pickle"
    expect 1 "cut.pickle: not a readable pickle: offset [0-9]+: truncated pickle" "$tide" replay "$scratch/cut.pickle"
    printf '\200\002cos\nsystem\n.' >"$scratch/evil.pickle"
    expect 1 "evil.pickle: not a readable pickle: offset 2: unsupported pickle opcode 0x63 \(GLOBAL\)" "$tide" replay "$scratch/evil.pickle"
    # a gzip bomb: 32 KiB of gzip, 32 MiB of EMPTY_LIST (the reader took 40 to
    # 64 bytes of memory for each) refused within its first MiB, under a
    # 512 MiB address-space limit where the build allows one (not ASan's)
    { printf '\200\002'; head -c $((32 << 20)) /dev/zero | tr '\000' ']'; printf .; } | gzip -c >"$scratch/bomb.pickle.gz"
    limited=""
    sh -c 'ulimit -v 524288 && exec "$0" --help' "$tide" >/dev/null 2>&1 && limited="ulimit -v 524288 &&"
    expect 1 "bomb.pickle.gz: not a readable pickle: offset [0-9]+: malformed pickle: its first [0-9]+ bytes take more than [0-9]+ bytes of memory to read \(32 a byte plus 1048576; a snapshot takes about 4 a byte\)" \
        sh -c "$limited exec \"\$0\" replay \"\$1\"" "$tide" "$scratch/bomb.pickle.gz"
    expect 0 "at most 4 GiB" "$tide" replay --help
    expect 0 "torch.cuda.memory._record_memory_history\\(\\)" "$tide" replay --help
    grep -q "tidepool CSV" "$out" || fail "tide replay --help does not name the tidepool CSV format"
    grep -q "PyTorch snapshot" "$out" || fail "tide replay --help does not name PyTorch snapshots"
    ;;
*)
    echo "unknown group $group"; exit 2 ;;
esac

if [ "$failures" -ne 0 ]; then
    echo "cli_test $group: $failures failure(s)"
    exit 1
fi
echo "cli_test $group: all checks passed"
