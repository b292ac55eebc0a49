#!/usr/bin/env bash
# The README's main job in one go: install what is missing, build, serve
# the sample tensors, fetch a few back (plain, transcoded to column-major by
# the server, a region), show what happened (--stats), list the keys, and
# stop the server gracefully.
#
#   scripts/demo.sh [path/to/hurray]
#
# Without an argument it installs the Debian packages it needs and builds
# build/release/cli/hurray first.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
hurray=${1:-${HURRAY:-}}
if [[ -z $hurray ]]; then
  bash "$here/scripts/deps.sh" demo
  cmake -S "$here" -B "$here/build/release" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DHR_BUILD_TESTS=OFF -DHR_BUILD_PERF=OFF >/dev/null
  cmake --build "$here/build/release" -j"$(nproc)" --target hurray >/dev/null
  hurray=$here/build/release/cli/hurray
fi
data=$here/examples/data
if [[ ! -x $hurray ]]; then
  echo "demo: no hurray binary at $hurray (build first: cmake -S . -B build && cmake --build build)" >&2
  exit 1
fi
out=$(mktemp -d)
server_log=$out/server.log
server_pid=
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$out"
}
trap cleanup EXIT

# Port 0: the kernel picks a free port; the server prints it.
"$hurray" serve --listen 127.0.0.1:0 "$data" >"$out/port" 2>"$server_log" &
server_pid=$!
for _ in $(seq 1 100); do
  grep -q "listening on" "$out/port" 2>/dev/null && break
  sleep 0.05
done
addr=$(awk '/listening on/ {print $3}' "$out/port")
if [[ -z $addr ]]; then
  echo "demo: the server did not start:" >&2
  cat "$server_log" >&2
  exit 1
fi
url=hurray://$addr
echo "== serving $data at $url"
"$hurray" ls "$url"

echo
echo "== plain GET of matrix (stored row-major)"
"$hurray" get --stats -o "$out/matrix.npy" "$url" matrix

echo
echo "== the same tensor, transcoded to column-major by the server"
"$hurray" get --layout column-major --allow-transcode --stats \
  -o "$out/matrix_f.npy" "$url" matrix

echo
echo "== a region: rows 1-2, columns 2-4"
"$hurray" get --region 1,2:2,3 --stats -o "$out/region.npy" "$url" matrix

echo
echo "== a tensor of the safetensors file"
"$hurray" get --stats "$url" model/embed.weight

echo
echo "== stopping the server (SIGTERM: graceful drain)"
kill -TERM "$server_pid"
wait "$server_pid" && echo "server exited 0"
server_pid=
