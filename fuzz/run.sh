#!/usr/bin/env bash
# fuzz/run.sh [seconds]: builds the libFuzzer targets (clang, in their own
# build folder), seeds their corpora from the test vectors and the corpus
# committed under tests/fuzz_corpus/<target>/, and runs each target for its
# share of `seconds` (default 60 in all), split by weight: the whole-session
# targets reach most code and get the most, the small parsers the least.
# fuzz_rdma_sm exists only where fabric/ is built (libfabric's headers).
# Exits non-zero on any crash, leak, timeout, UB or broken invariant; the
# reproducer is left in the artifacts folder it names.
#
# Environment: HURRAY_VECTORS_DIR (default <repo>/../shared/vectors),
# HR_FUZZ_BUILD_DIR (default <repo>/build/fuzz).  With CI=true a missing
# vector folder is an error (the seeds are part of what CI checks).
set -euo pipefail

total=${1:-60}
if ! [[ $total =~ ^[0-9]+$ ]] || [ "$total" -lt 2 ]; then
  echo "usage: $0 [seconds >= 2]" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HR_FUZZ_BUILD_DIR:-$root/build/fuzz}
vectors=${HURRAY_VECTORS_DIR:-$root/../shared/vectors}
# target:weight
# The session targets reach the most (the RDMA and SHM planes, lanes,
# the simulated device) and get the most.
weighted=(fuzz_codec:1 fuzz_reader:2 fuzz_server_session:5
          fuzz_client_session:4 fuzz_device_session:2 fuzz_rdma_sm:2
          fuzz_files:1 fuzz_auth:1)

CC=${CC:-clang} cmake -S "$root" -B "$build" -G Ninja -DHR_FUZZ=ON \
  -DHR_BUILD_TESTS=OFF -DHR_BUILD_PERF=OFF -DHR_BUILD_EXAMPLES=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=()
weights=()
for tw in "${weighted[@]}"; do
  t=${tw%%:*}
  if [ "$t" = fuzz_rdma_sm ] && ! grep -q "^build fuzz/fuzz_rdma_sm:" \
      "$build/build.ninja"; then
    echo "fuzz/run.sh: fabric/ not built here: no fuzz_rdma_sm" >&2
    continue
  fi
  targets+=("$t")
  weights+=("${tw##*:}")
done
cmake --build "$build" -j2 --target "${targets[@]}"

seeds=$build/fuzz-seeds
rm -rf "$seeds"
if compgen -G "$vectors/*.json" >/dev/null; then
  python3 "$root/fuzz/seed_corpus.py" "$vectors" "$seeds"
else
  if [ "${CI:-}" = true ]; then
    echo "fuzz/run.sh: no test vectors in $vectors (CI=true: failing)" >&2
    exit 1
  fi
  echo "fuzz/run.sh: no test vectors in $vectors: fuzzing without seeds" >&2
  for t in "${targets[@]}"; do mkdir -p "$seeds/${t#fuzz_}"; done
fi

# Each target gets its weight's share, rounded up (at least a second), so
# the total is >= $total.
wsum=0
for w in "${weights[@]}"; do wsum=$((wsum + w)); done
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
# libinfinipath (loaded through libfabric) would drop a backtrace file
# into the working folder at every crash: the log has the stack already.
export IPATH_NO_BACKTRACE=1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
logs=$build/fuzz-logs
mkdir -p "$logs"
status=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  each=$(( (total * weights[i] + wsum - 1) / wsum ))
  corpus=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t
  # Targets the vectors do not seed start from their committed corpus.
  mkdir -p "$corpus" "$artifacts" "$seeds/${t#fuzz_}"
  echo "== $t: ${each}s (log: $logs/$t.log)"
  # The first folder collects new inputs; the seeds and the committed
  # corpus are read only.
  committed=()
  if [ -d "$root/tests/fuzz_corpus/$t" ]; then
    committed=("$root/tests/fuzz_corpus/$t")
  fi
  if "$build/fuzz/$t" -max_total_time="$each" -max_len=65536 \
      -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$corpus" "$seeds/${t#fuzz_}" \
      "${committed[@]}" >"$logs/$t.log" 2>&1; then
    grep -E '^(Done|stat::(new_units_added|peak_rss_mb))' "$logs/$t.log" ||
      true
  else
    tail -n 60 "$logs/$t.log" >&2
    echo "fuzz/run.sh: $t FAILED; reproducer(s) in $artifacts" >&2
    status=1
  fi
done
exit $status
