#!/usr/bin/env bash
# Builds and runs the two-process NIXL move test (ctests/nixl/test_nixl_move.c) against
# libskv.so and NIXL's C API as scripts/nixl_fetch.sh placed it.
#   ctests/nixl/run.sh [LIBDIR [NIXL_DIR]]   defaults: target/release, target/nixl
# UCX moves host memory between the two processes over loopback TCP (UCX_TLS=tcp,self):
# NIXL's UCX backend needs a transport with peer-failure handling, which UCX's shared-memory
# transports (sm: posix, sysv, cma) lack, so it refuses them.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
libdir="${1:-target/release}"
nixl="${2:-target/nixl}"
case "$libdir" in /*) ;; *) libdir="$root/$libdir" ;; esac
case "$nixl" in /*) ;; *) nixl="$root/$nixl" ;; esac
[ -e "$libdir/libskv.so" ] ||
  { echo "nixl-test: $libdir/libskv.so not found (cargo build --release)" >&2; exit 2; }
[ -e "$nixl/lib/libnixl_capi.so" ] && [ -e "$nixl/include/nixl_capi.h" ] ||
  { echo "nixl-test: NIXL not in $nixl (scripts/nixl_fetch.sh puts it there)" >&2; exit 2; }

build="$root/target/ctests/nixl"
mkdir -p "$build/lib"
soname="$(readelf -d "$libdir/libskv.so" | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')"
ln -sfn "$libdir/libskv.so" "$build/lib/${soname:-libskv.so}"
gcc -std=c11 -Wall -Wextra -Werror -pedantic -g -O2 \
  -I"$root/include" -I"$root/ctests" -I"$nixl/include" \
  "$root/ctests/nixl/test_nixl_move.c" "$root/ctests/nixl/nixl_link.c" -o "$build/test_nixl_move" \
  -L"$libdir" -lskv -L"$nixl/lib" -lnixl_capi \
  -Wl,-rpath,"$build/lib" -Wl,-rpath,"$nixl/lib"

export UCX_TLS=tcp,self
export NIXL_PLUGIN_DIR="$nixl/lib/plugins"
# UCX's own warnings (e.g. about memory types it cannot detect) stay visible; errors fail.
export UCX_LOG_LEVEL="${UCX_LOG_LEVEL:-warn}"
"$build/test_nixl_move"
