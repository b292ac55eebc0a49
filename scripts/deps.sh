#!/usr/bin/env bash
# Installs the Debian 12 packages libhurray needs.  Usage: deps.sh [demo|test]
# (test adds the toolchains and tools the test suite uses).  Runs apt-get
# only for packages that are missing; uses sudo when not root.
set -euo pipefail
what=${1:-demo}
pkgs=(build-essential cmake ninja-build pkg-config python3 libfabric-dev
      libevent-dev libssl-dev libcjson-dev)
if [ "$what" = test ]; then
  pkgs+=(clang libclang-rt-14-dev llvm libcmocka-dev iproute2 iperf3
        libvulkan-dev mesa-vulkan-drivers libze-dev libamdhip64-dev
        libfabric-dev libfabric-bin libibverbs-dev librdmacm-dev libpsm2-dev
        libpsm-infinipath1-dev ucx-utils valgrind)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing: ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
