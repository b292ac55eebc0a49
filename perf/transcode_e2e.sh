#!/usr/bin/env bash
# End-to-end cost of transcoding on the wire (issue 4): a GET of a float32
# 8192x8192 (256 MiB) tensor stored row-major, fetched as stored and then
# transcoded by the server to COLUMN_MAJOR, through `hurray serve` and
# `hurray get --stats` on loopback, in the same run.  `seconds` in --stats
# runs from the request to the last byte in place (no process start, no
# output file).  Prints the best of N runs of each and the ratio
# (target: transcoded <= 1.3x plain: the pipeline hides the kernel).
#
#   perf/transcode_e2e.sh [path/to/hurray] [runs]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
hurray=${1:-$here/build/gcc/cli/hurray}
runs=${2:-5}
[[ -x $hurray ]] || { echo "transcode_e2e: no hurray at $hurray" >&2; exit 1; }
dir=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && kill -TERM $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

python3 - "$dir/big.npy" <<'PY'
import sys
n = 8192
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (n, n)
hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode())
    row = bytes(range(256)) * (n * 4 // 256)
    for _ in range(n):
        f.write(row)
PY
"$hurray" serve --listen 127.0.0.1:0 "$dir" >"$dir/port" 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$dir/port" && break; sleep 0.05; done
url=hurray://$(awk '/listening on/ {print $3}' "$dir/port")

best() { # best seconds over $runs runs of: hurray get ARGS
  local b=""
  for _ in $(seq "$runs"); do
    s=$("$hurray" get --stats "$@" "$url" big 2>&1 >/dev/null |
        python3 -c 'import sys,json; print(json.loads(sys.stdin.readlines()[-1])["seconds"])')
    b=$(python3 -c "print(min(float('$s'), float('${b:-inf}')))")
  done
  echo "$b"
}
plain=$(best)
xc=$(best --layout column-major --allow-transcode)
python3 - "$plain" "$xc" <<'PY'
import sys
p, x = map(float, sys.argv[1:])
gb = 8192 * 8192 * 4 / 1e9
print(f"GET 256 MiB float32, as stored (ROW_MAJOR): {p:.3f} s  {gb/p:.2f} GB/s  (baseline)")
print(f"GET 256 MiB, transcoded to COLUMN_MAJOR:    {x:.3f} s  {gb/x:.2f} GB/s")
print(f"ratio transcoded/plain: {x/p:.2f}  (target <= 1.30)")
PY
