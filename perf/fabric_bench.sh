#!/usr/bin/env bash
# Runs fabric_bench (raw libfabric RMA writes against libhurray's RDMA data
# plane and a whole GET through two engines over it, tcp;ofi_rxm and shm,
# loopback, with the ratios to raw) and, beside it, UCX's
# ucx_perftest ucp_put_bw over UCX_TLS=tcp and UCX_TLS=sm with the same
# 1 GiB in 4 MiB puts, when ucx-utils is installed (Debian: ucx-utils);
# without it that part is skipped.  ucx_perftest runs in its loopback mode
# (-l: one process talks to itself), so no socket listens on the network.
#
# Usage: perf/fabric_bench.sh [BUILD_DIR [fabric_bench options...]]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
bench=$build/perf/fabric_bench
if [ ! -x "$bench" ]; then
  echo "fabric_bench not built in $build (needs libfabric)" >&2
  exit 1
fi
"$bench" "$@"

echo
if ! command -v ucx_perftest >/dev/null 2>&1; then
  echo "ucx_perftest: skipped (ucx-utils is not installed)"
  exit 0
fi
echo "== ucx_perftest ucp_put_bw, 256 x 4 MiB, loopback (-l), best of 3"
for tls in tcp sm; do
  best=""
  for run in 1 2 3; do
    if ! out=$(UCX_TLS=$tls UCX_NET_DEVICES=lo timeout 300 \
               ucx_perftest -l -t ucp_put_bw -s 4194304 -n 256 -w 16 2>&1); then
      echo "UCX_TLS=$tls: ucx_perftest failed:"
      tail -3 <<<"$out"
      continue 2
    fi
    # Final: iters p50 avg overall bw-avg bw-overall rate-avg rate-overall;
    # bandwidth in MiB/s.
    mibs=$(awk '/^Final:/ {print $(NF-2)}' <<<"$out")
    gbs=$(awk -v m="$mibs" 'BEGIN {printf "%.2f", m * 1048576 / 1e9}')
    best=$(awk -v a="${best:-0}" -v b="$gbs" 'BEGIN {print (b > a) ? b : a}')
    runs="${runs:-}$gbs "
  done
  printf 'UCX_TLS=%-3s ucp_put_bw:            %6.2f GB/s (runs: %s)\n' \
    "$tls" "$best" "${runs% }"
  runs=""
done
