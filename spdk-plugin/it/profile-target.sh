#!/usr/bin/env bash
# Profiles nvmf_tgt in the bare and the QoS phase of weighted_qos's
# `weighted_excess_whatever_the_queue_depth` (docs/benchmarks.md, "Where the target's
# cycles go at saturation with `operating_point`"): `perf record` on the first nvmf_tgt
# (bare, 5 s in, for 4 s) and on the second (QoS, 15 s in, for 5 s), then the samples by
# shared object and the test's summary. Divide a phase's samples per second by its IOPS
# for its cost per command. The test's environment passes through (QOS_IT_SHARING,
# QOS_IT_EFFICIENCY, QOS_IT_PROFILE, QOS_IT_ESTIMATOR, NVMF_QOS_TGT_LIB, SPDK_DIR).
#
#   SPDK_DIR=/opt/spdk QOS_IT_SHARING=operating_point spdk-plugin/it/profile-target.sh [OUT_DIR]
#
# Needs `perf` (Debian: linux-perf) and the rights to attach to nvmf_tgt
# (perf_event_paranoid <= 2 for a process of your own). Kills nothing: the test stops
# its targets.
set -euo pipefail
out=${1:-/tmp/nvmf-qos-profile}
command -v perf >/dev/null || { echo "perf not found (apt install linux-perf)" >&2; exit 2; }
[ -x "${SPDK_DIR:-/opt/spdk}/build/bin/nvmf_tgt" ] || {
    echo "SKIPPED: no nvmf_tgt under SPDK_DIR=${SPDK_DIR:-/opt/spdk}" >&2; exit 0; }
if pgrep -x nvmf_tgt >/dev/null; then
    echo "an nvmf_tgt is running already: stop it first (the script attaches to the test's)" >&2
    exit 2
fi
mkdir -p "$out"
cd "$(dirname "$0")/../.."
cargo test --release -p target-it --test weighted_qos weighted_excess_whatever \
    -- --ignored --nocapture >"$out/test.log" 2>&1 &
test_pid=$!

# The pid of an nvmf_tgt other than $1, waiting up to 120 s.
next_target() {
    for _ in $(seq 1 1200); do
        local p
        p=$(pgrep -x nvmf_tgt | grep -vx "${1:-0}" | head -1 || true)
        [ -n "$p" ] && { echo "$p"; return 0; }
        kill -0 "$test_pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

bare=$(next_target) || { echo "the test started no nvmf_tgt; see $out/test.log" >&2; exit 1; }
echo "bare phase: nvmf_tgt $bare"
sleep 5
perf record -q -F 2000 -p "$bare" -o "$out/bare.data" -- sleep 4 2>/dev/null
while kill -0 "$bare" 2>/dev/null; do sleep 0.1; done
qos=$(next_target "$bare") || { echo "no QoS phase; see $out/test.log" >&2; exit 1; }
echo "QoS phase: nvmf_tgt $qos"
sleep 15
perf record -q -F 2000 -p "$qos" -o "$out/qos.data" -- sleep 5 2>/dev/null
wait "$test_pid" || echo "(the test failed its checks; the profile stands)"

for phase in bare qos; do
    echo "== $phase: samples by shared object ($out/$phase.data)"
    perf report -i "$out/$phase.data" --no-children --sort dso --stdio -n 2>/dev/null |
        grep -E '^# Samples|^ +[0-9]' | head -12
done
echo "== the test's figures ($out/test.log)"
grep -E 'without QoS|with QoS|operating point' "$out/test.log" || true
