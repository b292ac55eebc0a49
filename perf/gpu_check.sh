#!/usr/bin/env bash
# perf/gpu_check.sh: the device check for a machine with an NVIDIA GPU.
#
#   1. finds the CUDA toolkit's headers (HR_CUDA_ROOT, /usr/local/cuda, or
#      next to nvcc) and reports the machine (nvidia-smi, libcuda.so.1);
#   2. builds the device tests and the staging benchmark with the CUDA
#      backend: with CMake when the project configures here, else directly
#      with cc (no cmocka, pkg-config or libevent needed: the tests then use
#      the tests/gpu/gt_nocmocka.h stand-in);
#   3. runs the ADR-018 contract tests and the API tests on the simulated
#      device (a sanity check of the harness) and on CUDA;
#   4. runs the CUDA transcode kernels' test (tests/transcode_cuda: device
#      output against the CPU kernels) and transcode/cuda/xc_cuda_bench
#      (the row-major -> column-major transpose in GB/s against a D2D copy
#      of the same bytes); CMake builds only, as nvcc embeds the kernels;
#   5. runs perf/gpu_bench: H2D and D2H of SIZE (default 1 GiB) through the
#      library's staging path against one copy to/from pinned memory
#      (cuMemcpyAsync on cuMemHostAlloc memory, i.e. cudaMemcpy of pinned
#      memory), printing the ratios; the target is >= 0.85;
#   6. runs the engine's device tests (tests/gpu/test_gpu_engine.c: serving
#      a device tensor, receiving into device memory P1/P2, the loop never
#      blocking) on sim and on CUDA (CMake builds: they need cmocka and
#      libevent), and perf/gpu_engine_bench: a GET of a SIZE-byte device
#      tensor to the host and a GET into device memory, through the engine
#      over loopback, against the pinned copy and the loopback GET, printing
#      the ratios (target >= 0.85 of the slower of the two);
#   7. runs the IPC tests (tests/gpu/test_gpu_ipc.c: shareable memory
#      exported as a POSIX fd and imported by a child process, the engine
#      handing it over a Unix socket) on sim and on CUDA (CMake builds).
#
# Usage: bash perf/gpu_check.sh [SIZE]     e.g. SIZE=1G (default), 256M
# Environment: HR_CUDA_ROOT (toolkit), HR_GPU_CHECK_DIR (build directory,
# default build/gpu-check), HR_GPU_CHECK_DIRECT=1 (skip CMake).
# Exit status: 0 when everything passed, 1 when a build or test failed
# (a CUDA check that skips counts as failed when nvidia-smi lists a GPU:
# the device is there but the backend could not use it), 77 when nothing
# failed but something was skipped (no CUDA device here).
# A benchmark below its target is reported in the summary, not failed.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
size=${1:-1G}
out=${HR_GPU_CHECK_DIR:-$root/build/gpu-check}
jobs=$(nproc 2>/dev/null || echo 4)
mkdir -p "$out"
results=()
status=0
skipped=0

step() { printf '\n==== %s ====\n' "$*"; }
have_gpu=0 # nvidia-smi lists a GPU: a CUDA check that skips is a failure
record() { # record NAME RESULT
  local r=$2
  case $r in
    SKIPPED*cuda* | SKIPPED*"backend unavailable"* | SKIPPED*"no device"*)
      [ $have_gpu = 1 ] && r="FAIL (skipped although nvidia-smi lists a GPU: ${r#SKIPPED })" ;;
  esac
  results+=("$(printf '%-34s %s' "$1" "$r")")
  case $r in
    PASS* | "BELOW TARGET"*) ;;
    SKIPPED*) skipped=1 ;;
    *) status=1 ;;
  esac
}
run_limited() { # run_limited SECONDS CMD...: a command with a time limit
  local t=$1
  shift
  if command -v timeout >/dev/null; then timeout "$t" "$@"; else "$@"; fi
}

step "machine"
uname -a
echo "cores: $jobs"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L | grep -q '^GPU ' && have_gpu=1
  nvidia-smi -L || true
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
else
  echo "nvidia-smi: not found"
fi
if command -v ldconfig >/dev/null; then
  ldconfig -p | grep -E 'libcuda\.so\.1' || echo "libcuda.so.1: not in the loader cache"
fi

step "CUDA headers"
cuda_root=""
cands=("${HR_CUDA_ROOT:-}" /usr/local/cuda)
if command -v nvcc >/dev/null; then
  cands+=("$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)")
fi
for d in "${cands[@]}"; do
  if [ -n "$d" ] && [ -f "$d/include/cuda.h" ]; then
    cuda_root=$d
    break
  fi
done
if [ -z "$cuda_root" ]; then
  echo "FAIL: cuda.h not found (tried: ${cands[*]}); set HR_CUDA_ROOT"
  exit 1
fi
echo "toolkit: $cuda_root ($(grep -m1 '#define CUDA_VERSION' "$cuda_root/include/cuda.h"))"
cc=${CC:-cc}
command -v "$cc" >/dev/null || cc=gcc
echo "compiler: $($cc --version | head -1)"

# ---- build ---------------------------------------------------------------
bin_api="" bin_contract="" bin_bench="" bin_xc="" bin_xc_bench=""
bin_engine="" bin_engine_bench="" bin_ipc=""
build_cmake() {
  command -v cmake >/dev/null || { echo "cmake: not found"; return 1; }
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  local b=$out/cmake
  cmake -S "$root" -B "$b" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DHR_CUDA_ROOT="$cuda_root" -DHR_GPU_CUDA=ON -DHR_GPU_HIP=OFF \
    -DHR_GPU_ZE=OFF -DHR_GPU_VULKAN=OFF -DHR_BUILD_PERF=ON \
    -DHR_BUILD_EXAMPLES=OFF >"$out/cmake-configure.log" 2>&1 || {
    echo "CMake configure failed (tail of $out/cmake-configure.log):"
    tail -5 "$out/cmake-configure.log"
    return 1
  }
  grep -q 'hurray gpu backends:.*cuda' "$out/cmake-configure.log" || {
    echo "CMake did not enable the CUDA backend"
    return 1
  }
  cmake --build "$b" -j"$jobs" --target gpu_api gpu_contract gpu_bench \
    xc_cuda xc_cuda_bench gpu_engine gpu_engine_bench gpu_ipc \
    >"$out/cmake-build.log" 2>&1 || {
    echo "CMake build failed (tail of $out/cmake-build.log):"
    tail -20 "$out/cmake-build.log"
    return 1
  }
  bin_api=$b/tests/gpu/gpu_api
  bin_contract=$b/tests/gpu/gpu_contract
  bin_bench=$b/gpu/gpu_bench
  bin_xc=$b/tests/transcode_cuda/xc_cuda
  bin_xc_bench=$b/transcode/cuda/xc_cuda_bench
  bin_engine=$b/tests/gpu/gpu_engine
  bin_ipc=$b/tests/gpu/gpu_ipc
  bin_engine_bench=$b/perf/gpu_engine_bench
}

build_direct() {
  local b=$out/direct
  mkdir -p "$b"
  local lib=("$root"/proto/*.c "$root"/engine/core/*.c "$root"/engine/io/*.c
             "$root"/engine/store/*.c)
  for f in hr_gpu hr_gpu_cpu hr_gpu_sim hr_gpu_ipc hr_stager hr_handoff \
           hr_dlpack hr_gpu_cuda; do
    lib+=("$root/gpu/$f.c")
  done
  local flags=(-std=c11 -O2 -g -D_GNU_SOURCE -DHR_GPU_HAVE_CUDA
               -DHR_NO_CMOCKA -I"$root/include" -I"$root/proto"
               -I"$root/engine/core" -I"$root/engine/io" -I"$root/gpu"
               -I"$root/tests/gpu"
               -I"$cuda_root/include")
  # engine/io/hr_tls.c needs OpenSSL 3 (Debian: libssl-dev).
  local libs=(-lssl -lcrypto -lpthread -ldl -lm)
  local objs=()
  for f in "${lib[@]}"; do
    # engine/core and engine/io both have an hr_client.c: keep the folder.
    local o=$b/$(basename "$(dirname "$f")")_$(basename "${f%.c}").o
    "$cc" "${flags[@]}" -c "$f" -o "$o" || return 1
    objs+=("$o")
  done
  "$cc" "${flags[@]}" "$root/tests/gpu/test_gpu_api.c" "${objs[@]}" \
    -o "$b/gpu_api" "${libs[@]}" || return 1
  "$cc" "${flags[@]}" "$root/tests/gpu/test_gpu_contract.c" "${objs[@]}" \
    -o "$b/gpu_contract" "${libs[@]}" || return 1
  "$cc" "${flags[@]}" "$root/perf/gpu_bench.c" "${objs[@]}" \
    -o "$b/gpu_bench" "${libs[@]}" || return 1
  "$cc" "${flags[@]}" "$root/perf/gpu_engine_bench.c" \
    "$root/perf/bench_common.c" "${objs[@]}" \
    -o "$b/gpu_engine_bench" "${libs[@]}" || return 1
  bin_engine_bench=$b/gpu_engine_bench
  bin_api=$b/gpu_api
  bin_contract=$b/gpu_contract
  bin_bench=$b/gpu_bench
}

step "build"
if [ "${HR_GPU_CHECK_DIRECT:-0}" != 1 ] && build_cmake; then
  echo "built with CMake in $out/cmake"
  record "build" "PASS (cmake)"
else
  echo "building directly with $cc in $out/direct"
  if build_direct; then
    record "build" "PASS (direct)"
  else
    record "build" "FAIL"
    step "summary"
    printf '%s\n' "${results[@]}"
    exit 1
  fi
fi

# ---- tests ---------------------------------------------------------------
run_test() { # run_test NAME BINARY BACKEND
  step "$1"
  run_limited 300 "$2" "$3"
  local rc=$?
  case $rc in
    0) record "$1" "PASS" ;;
    77) record "$1" "SKIPPED (backend unavailable: see above)" ;;
    124) record "$1" "FAIL (timed out)" ;;
    *) record "$1" "FAIL (exit $rc)" ;;
  esac
}
run_test "contract tests on sim" "$bin_contract" sim
run_test "API tests on cuda" "$bin_api" cuda
run_test "contract tests on cuda" "$bin_contract" cuda

if [ -n "$bin_xc" ]; then
  step "transcode kernels on cuda"
  run_limited 300 "$bin_xc"
  rc=$?
  case $rc in
    0) record "transcode kernels on cuda" "PASS" ;;
    77) record "transcode kernels on cuda" "SKIPPED (no device or no nvcc)" ;;
    *) record "transcode kernels on cuda" "FAIL (exit $rc)" ;;
  esac
  step "transpose vs D2D copy"
  run_limited 300 "$bin_xc_bench" 256
  rc=$?
  case $rc in
    0) record "transpose vs D2D copy" "PASS (see GB/s above)" ;;
    77) record "transpose vs D2D copy" "SKIPPED (no device or no nvcc)" ;;
    *) record "transpose vs D2D copy" "FAIL (exit $rc)" ;;
  esac
else
  record "transcode kernels on cuda" "SKIPPED (direct build: needs CMake)"
fi

step "staging benchmark ($size)"
run_limited 300 "$bin_bench" --backend cuda --size "$size"
rc=$?
case $rc in
  0) record "staging bandwidth ($size)" "PASS (ratios >= 0.85)" ;;
  1) record "staging bandwidth ($size)" "BELOW TARGET (ratio < 0.85)" ;;
  77) record "staging bandwidth ($size)" "SKIPPED (cuda unavailable)" ;;
  *) record "staging bandwidth ($size)" "FAIL (exit $rc)" ;;
esac

if [ -n "$bin_engine" ]; then
  run_test "engine device tests on sim" "$bin_engine" sim
  run_test "engine device tests on cuda" "$bin_engine" cuda
else
  record "engine device tests" "SKIPPED (direct build: needs CMake, cmocka, libevent)"
fi
if [ -n "$bin_ipc" ]; then
  run_test "IPC tests on sim" "$bin_ipc" sim
  run_test "IPC tests on cuda" "$bin_ipc" cuda
else
  record "IPC tests" "SKIPPED (direct build: needs CMake, cmocka, libevent)"
fi

step "engine staging benchmark ($size)"
run_limited 300 "$bin_engine_bench" --backend cuda --size "$size"
rc=$?
case $rc in
  0) record "engine staging ($size)" "PASS (ratios >= 0.85)" ;;
  1) record "engine staging ($size)" "BELOW TARGET (ratio < 0.85)" ;;
  77) record "engine staging ($size)" "SKIPPED (cuda unavailable)" ;;
  *) record "engine staging ($size)" "FAIL (exit $rc)" ;;
esac

step "summary"
printf '%s\n' "${results[@]}"
if [ $status -ne 0 ]; then
  echo "gpu_check: FAILED"
  exit 1
fi
if [ $skipped -ne 0 ]; then
  echo "gpu_check: nothing failed, some checks SKIPPED (see above)"
  exit 77
fi
echo "gpu_check: ALL PASSED"
exit 0
