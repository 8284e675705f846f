#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) from its committed seeds,
# printing executions and exec/s per target. Crash inputs land in
# fuzz/artifacts/<target>/ (ignored by git). Usage: fuzz/run-all.sh [SECONDS]
set -uo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
target_dir="${CARGO_TARGET_DIR:-target}"  # cargo fuzz ignores the env var; pass it on
status=0
for t in $(cargo +nightly fuzz list); do
    mkdir -p "corpus/$t"
    log="$(mktemp)"
    cargo +nightly fuzz run --target-dir "$target_dir" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1 || status=1
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$')
    crash=$(grep -m1 -o 'Test unit written to .*' "$log" || true)
    echo "$t execs=${execs:-?} exec/s=${speed:-?} ${crash:+CRASH: $crash}"
    [ -n "$crash" ] && grep -m3 -A3 'panicked at' "$log"
    rm -f "$log"
done
exit "$status"
