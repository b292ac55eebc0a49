#!/usr/bin/env bash
# Usage: run.sh BUILD_DIR CONSUMER_SRC_DIR CC
# (grep without -q after ldd: -q exits at the first match, ldd dies of
# SIGPIPE, and pipefail turned that into a failure now and then.)
set -euo pipefail
build=$1 src=$2 cc=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig:$prefix/lib/$(gcc -print-multiarch 2>/dev/null || true)/pkgconfig
libdir=$(pkg-config --variable=libdir hurray)

# pkg-config, shared.
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/shared" "$src/main.c" \
  $(pkg-config --cflags --libs hurray)
LD_LIBRARY_PATH=$libdir "$work/shared" shared-pc
ldd "$work/shared" | grep libhurray.so >/dev/null || { echo "not linked shared"; exit 1; }
# libfabric is loaded at run time, never linked (its providers' constructors
# would run in every process).
if LD_LIBRARY_PATH=$libdir ldd "$work/shared" | grep libfabric >/dev/null; then
  echo "libhurray links libfabric"; exit 1
fi

# pkg-config, static: libhurray.a plus its private dependencies.
libs=$(pkg-config --static --libs hurray | sed 's/-lhurray/-Wl,-Bstatic -lhurray -Wl,-Bdynamic/')
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/static" "$src/main.c" \
  $(pkg-config --cflags hurray) $libs
"$work/static" static-pc
if ldd "$work/static" | grep libhurray.so >/dev/null; then echo "static build links libhurray.so"; exit 1; fi

# find_package(hurray), both libraries.
cmake -S "$src" -B "$work/cm" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" >/dev/null
cmake --build "$work/cm" >/dev/null
LD_LIBRARY_PATH=$libdir "$work/cm/consumer_shared" shared-cmake
"$work/cm/consumer_static" static-cmake
echo "install test: 4 passed, 0 failed"
