#!/usr/bin/env bash
# Installs what is missing, builds and runs every test:
#   1. gcc, -Wall -Wextra -Werror: the whole suite (units, vectors,
#      split-point feed, engine integration, install test, layering lint),
#      the soak test (tests/soak, label "soak") for 60 seconds;
#   2. clang, -Werror, ASan+UBSan (-fno-sanitize-recover, LeakSanitizer on):
#      the whole suite again but the soak, which runs here on its own for
#      20 seconds with 16 clients (a second full minute would not fit the
#      budget; the short run still covers every kind of request);
#   3. clang, ThreadSanitizer: the tests labelled "threaded", and the soak
#      for 15 seconds with 8 clients;
#   4. valgrind memcheck: the soak, 20 seconds with 8 clients, clean
#      (every leak kind an error, --error-exitcode);
#   5. libFuzzer: every fuzz target (codec, reader, whole server and client
#      sessions, the client with the simulated device, RDMA handshake,
#      .npy/.safetensors files, token file), 100 seconds in all, split by
#      weight (fuzz/run.sh).
# Build trees go to build/ under the repository.  Exits non-zero on any
# failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh test
jobs=$(nproc)
export CTEST_OUTPUT_ON_FAILURE=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

stage() { printf '\n==== %s ====\n' "$*"; }

stage "gcc -Werror: build and test"
cmake -S . -B build/gcc -G Ninja -DCMAKE_C_COMPILER=gcc -DHR_WERROR=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/gcc -j"$jobs"
HR_SOAK_SECONDS=60 ctest --test-dir build/gcc -j"$jobs" --timeout 600

stage "clang -Werror, ASan+UBSan: build and test"
cmake -S . -B build/asan -G Ninja -DCMAKE_C_COMPILER=clang -DHR_WERROR=ON \
  -DHR_SANITIZE=ON -DHR_BUILD_PERF=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build/asan -j"$jobs"
ctest --test-dir build/asan -j"$jobs" --timeout 900 -LE soak
build/asan/tests/soak/test_soak --seconds 20 --clients 16

stage "clang ThreadSanitizer: threaded tests"
cmake -S . -B build/tsan -G Ninja -DCMAKE_C_COMPILER=clang -DHR_WERROR=ON \
  -DHR_TSAN=ON -DHR_BUILD_PERF=OFF -DHR_BUILD_EXAMPLES=OFF -DHR_XC_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build/tsan -j"$jobs"
ctest --test-dir build/tsan -j"$jobs" -L threaded --timeout 900 --no-tests=error
build/tsan/tests/soak/test_soak --seconds 15 --clients 8 --max-kib 256

stage "valgrind memcheck: short soak"
valgrind --error-exitcode=99 --leak-check=full \
  --show-leak-kinds=definite,indirect,possible \
  --errors-for-leak-kinds=definite,indirect,possible -q \
  build/gcc/tests/soak/test_soak --seconds 20 --clients 8 --max-kib 256

stage "libFuzzer: 100 seconds"
bash fuzz/run.sh 100

stage "all stages passed"
