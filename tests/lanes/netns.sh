#!/bin/bash
# Lanes across two hosts: two network namespaces joined by a veth pair, a
# tc htb rate limit on each end, the server (lanes_probe serve) in one and
# the clients in the other: the API checks (lanes_probe check: parallel
# GETs over 1 to 4 lanes, regions, a lane cut from either side) and the
# CLI (hurray get --parallel/--connections/--region/--slice/--stats), every
# fetch compared byte for byte with the files lanes_probe expect writes.
#
# usage: netns.sh --netns|--loopback LANES_PROBE HURRAY
#   --netns     the two-host setup; exit 77 (skipped) where namespaces,
#               veth pairs or root are not available
#   --loopback  the same checks over 127.0.0.1, no setup needed
#
# Only addresses inside the namespaces made here are used (10.77.0.1 and
# 10.77.0.2 on the veth pair); everything made is removed on exit.
set -u
mode=${1:-} probe=${2:-} hurray=${3:-}
if [ -z "$hurray" ] || { [ "$mode" != --netns ] && [ "$mode" != --loopback ]; }; then
  echo "usage: $0 --netns|--loopback LANES_PROBE HURRAY" >&2
  exit 2
fi

tmp=$(mktemp -d)
ns_s="" ns_c="" srv_pid=""
cleanup() {
  if [ -n "$srv_pid" ]; then
    kill "$srv_pid" 2>/dev/null
    wait "$srv_pid" 2>/dev/null
  fi
  # Deleting a namespace deletes its end of the veth pair, and the pair.
  [ -n "$ns_c" ] && ip netns del "$ns_c" 2>/dev/null
  [ -n "$ns_s" ] && ip netns del "$ns_s" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

skip() { echo "skipped: $*"; exit 77; }
fail() {
  echo "FAIL: $*"
  [ -s "$tmp/serve.err" ] && sed 's/^/server: /' "$tmp/serve.err"
  exit 1
}

run_s=() run_c=()
if [ "$mode" = --netns ]; then
  [ "$(id -u)" = 0 ] || skip "needs root"
  command -v ip >/dev/null && command -v tc >/dev/null ||
    skip "needs iproute2 (ip, tc)"
  tag=$$
  ip netns add "hrl_s_$tag" 2>/dev/null || skip "cannot make network namespaces"
  ns_s="hrl_s_$tag"
  ip netns add "hrl_c_$tag" 2>/dev/null || skip "cannot make network namespaces"
  ns_c="hrl_c_$tag"
  # Interface names: at most 15 characters.
  if_s="hrls$tag" if_c="hrlc$tag"
  ip link add "$if_s" type veth peer name "$if_c" 2>/dev/null ||
    skip "cannot make a veth pair"
  ip link set "$if_s" netns "$ns_s" && ip link set "$if_c" netns "$ns_c" ||
    fail "moving the veth ends into the namespaces"
  ip -n "$ns_s" addr add 10.77.0.1/24 dev "$if_s" &&
    ip -n "$ns_c" addr add 10.77.0.2/24 dev "$if_c" &&
    ip -n "$ns_s" link set lo up && ip -n "$ns_c" link set lo up &&
    ip -n "$ns_s" link set "$if_s" up && ip -n "$ns_c" link set "$if_c" up ||
    fail "addressing the veth pair"
  # 400 Mbit/s each way: a two-host link, slow enough for transfers to be
  # in flight when a lane is cut.
  for end in "$ns_s:$if_s" "$ns_c:$if_c"; do
    ns=${end%%:*} dev=${end#*:}
    # r2q 1000: a 50 kB quantum at this rate.
    # A kernel without the htb scheduler (sch_htb) lacks the setup, like
    # one without namespaces: skipped.
    tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 10 r2q 1000 \
      2>/dev/null || skip "no htb qdisc (sch_htb) in this kernel"
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:10 htb \
      rate 400mbit ceil 400mbit burst 64k || fail "tc htb class on $dev"
  done
  run_s=(ip netns exec "$ns_s") run_c=(ip netns exec "$ns_c")
  host=10.77.0.1
else
  host=127.0.0.1
fi

"${run_s[@]}" "$probe" serve "$host:0" >"$tmp/serve.out" 2>"$tmp/serve.err" &
srv_pid=$!
port=""
# Up to 30 s: a sanitizer build on a loaded machine starts slowly.
for _ in $(seq 300); do
  port=$(sed -n 's/^ready \([0-9]*\)$/\1/p' "$tmp/serve.out")
  [ -n "$port" ] && break
  kill -0 "$srv_pid" 2>/dev/null || fail "the server did not start"
  sleep 0.1
done
[ -n "$port" ] || fail "the server did not get ready"
url="hurray://$host:$port"
echo "server on $url ($mode)"

# The API: parallel GETs, regions, lanes cut from either side.
"${run_c[@]}" "$probe" check "$url" || fail "lanes_probe check"

# The CLI.
mkdir "$tmp/want" && "$probe" expect "$tmp/want" || fail "lanes_probe expect"
get() { "${run_c[@]}" "$hurray" get --timeout 60 "$@"; }

get --parallel 8 --connections 4 --stats -o "$tmp/big.npy" "$url" big \
  >/dev/null 2>"$tmp/stats" || fail "hurray get --parallel 8 --connections 4"
cmp -s "$tmp/big.npy" "$tmp/want/big.npy" || fail "big differs"
for field in '"shards":8' '"lanes":4' '"connections":4'; do
  grep -q "$field" "$tmp/stats" || fail "--stats lacks $field: $(cat "$tmp/stats")"
done
echo "hurray get --parallel 8 --connections 4: ok ($(sed -n 's/.*"gb_per_s":\([0-9.]*\).*/\1/p' "$tmp/stats") GB/s)"

get --region 100,0:900,1024 --parallel 4 --connections 2 -o "$tmp/region.npy" \
  "$url" big >/dev/null || fail "hurray get --region"
cmp -s "$tmp/region.npy" "$tmp/want/big_region.npy" || fail "the region differs"
echo "hurray get --region over 2 connections: ok"

get --slice 1:1/3 --parallel 2 --connections 3 -o "$tmp/slice.npy" "$url" big \
  >/dev/null || fail "hurray get --slice"
cmp -s "$tmp/slice.npy" "$tmp/want/big_slice.npy" || fail "the slice differs"
echo "hurray get --slice 1:1/3 over 3 connections: ok"

# A lane cut by the server: the GET fails cleanly (non-zero exit, a
# message), the next one on a new session works.
if get --parallel 6 --connections 3 -o "$tmp/cut.npy" "$url" '!cut2' \
  >/dev/null 2>"$tmp/cut.err"; then
  fail "a GET whose lane was cut succeeded"
fi
grep -q "lane" "$tmp/cut.err" || fail "no word of the lane: $(cat "$tmp/cut.err")"
get --parallel 6 --connections 3 -o "$tmp/after.npy" "$url" big >/dev/null ||
  fail "a GET after the cut"
cmp -s "$tmp/after.npy" "$tmp/want/big.npy" || fail "big differs after the cut"
echo "a lane cut under hurray get: ok"

kill "$srv_pid" && wait "$srv_pid"
rc=$?
srv_pid=""
[ "$rc" = 0 ] || fail "the server exited with $rc"
echo "all lanes checks passed ($mode)"
