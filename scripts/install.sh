#!/usr/bin/env bash
# Install libskv under PREFIX:
#   lib/libskv.so.X.Y.Z (+ its SONAME link, libskv.so.0.Y or libskv.so.X, and libskv.so),
#   lib/libskv.a,
#   include/skv.h, include/skv.hpp, lib/pkgconfig/skv.pc (shared) and skv-static.pc (static),
#   lib/cmake/skv/skvConfig.cmake, lib/cmake/skv/skvConfigVersion.cmake
#
# usage: scripts/install.sh [--no-build] [--debug-info] PREFIX
#   --no-build    install what `cargo build --release` already produced
#   --debug-info  also install the shared library's debug info as
#                 lib/.debug/libskv.so.X.Y.Z.debug (gdb finds it through .gnu_debuglink)
#                 and libskv.a unstripped; by default both are installed without debug info
#   DESTDIR       staged install: files go to $DESTDIR$PREFIX, paths inside them name PREFIX
set -euo pipefail

build=1
debug_info=0
prefix=
for arg in "$@"; do
  case "$arg" in
    --no-build) build=0 ;;
    --debug-info) debug_info=1 ;;
    -h|--help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) echo "install.sh: unknown option $arg" >&2; exit 2 ;;
    *) [ -z "$prefix" ] || { echo "install.sh: one PREFIX only" >&2; exit 2; }; prefix=$arg ;;
  esac
done
[ -n "$prefix" ] || { echo "usage: scripts/install.sh [--no-build] [--debug-info] PREFIX" >&2; exit 2; }
case "$prefix" in /*) ;; *) prefix="$PWD/$prefix" ;; esac
prefix=${prefix%/}
destdir=${DESTDIR:-}
case "$destdir" in ""|/*) ;; *) destdir="$PWD/$destdir" ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ "$build" = 1 ]; then
  cargo build --release -p skv --lib
fi

target_dir=${CARGO_TARGET_DIR:-$root/target}
release="$target_dir/release"
# The header build.rs generated with this library (include/skv.h is its committed copy).
header="$release/include/skv.h"
for f in "$release/libskv.so" "$release/libskv.a" "$header" include/skv.hpp; do
  [ -f "$f" ] || { echo "install.sh: missing $f (run without --no-build?)" >&2; exit 1; }
done
cmp -s "$header" include/skv.h ||
  echo "install.sh: warning: include/skv.h differs from the generated header (run make header)" >&2

# Every version fact is the header's, as build.rs derived it from the crate version.
define() {
  local v
  v=$(sed -n "s/^#define $1 \(.*\)\$/\1/p" "$header" | tr -d '"')
  [ -n "$v" ] || { echo "install.sh: no #define $1 in $header" >&2; exit 1; }
  echo "$v"
}
version=$(define SKV_VERSION)
major=$(define SKV_VERSION_MAJOR)
full="$major.$(define SKV_VERSION_MINOR).$(define SKV_VERSION_PATCH)"
soname=$(define SKV_SONAME)
soname_version=${soname#libskv.so.}
pointer_bits=$(rustc --print cfg | sed -n 's/^target_pointer_width="\([0-9]*\)"/\1/p')

# What a C linker must add for the Rust standard library inside libskv.a. libskv has no
# native dependencies of its own, so the list rustc reports for an empty staticlib
# built by the same toolchain is the list for libskv.a.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
native_libs=$(rustc --crate-type staticlib --crate-name probe --print native-static-libs \
    -o "$probe/libprobe.a" - </dev/null 2>&1 | sed -n 's/.*native-static-libs: //p')
[ -n "$native_libs" ] || { echo "install.sh: rustc did not report native-static-libs" >&2; exit 1; }
# The same list as CMake link items: -lfoo -> foo, anything else verbatim.
cmake_libs=
for lib in $native_libs; do
  case "$lib" in -l*) lib=${lib#-l} ;; esac
  cmake_libs="${cmake_libs:+$cmake_libs;}$lib"
done

dest="$destdir$prefix"
install -d "$dest/lib/pkgconfig" "$dest/lib/cmake/skv" "$dest/include"
so="$dest/lib/libskv.so.$full"
install -m 0755 "$release/libskv.so" "$so"
ln -sfn "libskv.so.$full" "$dest/lib/$soname"
ln -sfn "$soname" "$dest/lib/libskv.so"
install -m 0644 "$release/libskv.a" "$dest/lib/libskv.a"
# Without debug info by default; --debug-info keeps it beside, as distributions do.
if [ "$debug_info" = 1 ]; then
  install -d "$dest/lib/.debug"
  objcopy --only-keep-debug "$so" "$dest/lib/.debug/libskv.so.$full.debug"
  chmod 0644 "$dest/lib/.debug/libskv.so.$full.debug"
  objcopy --strip-debug --add-gnu-debuglink="$dest/lib/.debug/libskv.so.$full.debug" "$so"
else
  objcopy --strip-debug "$so"
  objcopy --strip-debug "$dest/lib/libskv.a"
fi
install -m 0644 "$header" include/skv.hpp "$dest/include/"

# Fills @FIELD@s from the environment: perl takes the values literally, whatever characters
# a prefix holds (sed would read '&' and '|' in it as syntax).
subst() {
  SKV_PREFIX=$prefix SKV_VERSION=$version SKV_VERSION_FULL=$full SKV_VERSION_MAJOR=$major \
  SKV_SONAME=$soname SKV_SONAME_VERSION=$soname_version SKV_POINTER_BITS=$pointer_bits SKV_POINTER_BYTES=$((pointer_bits / 8)) \
  SKV_NATIVE_STATIC_LIBS=$native_libs SKV_CMAKE_NATIVE_LIBS=$cmake_libs \
    perl -pe 's/\@([A-Z_]+)\@/exists $ENV{"SKV_$1"} ? $ENV{"SKV_$1"} : "\@$1\@"/ge' "$1" > "$2"
  chmod 0644 "$2"
  if grep -n '@[A-Z_]*@' "$2" >&2; then echo "install.sh: unfilled field in $2" >&2; exit 1; fi
}
subst cmake/skv.pc.in "$dest/lib/pkgconfig/skv.pc"
subst cmake/skv-static.pc.in "$dest/lib/pkgconfig/skv-static.pc"
subst cmake/skvConfig.cmake.in "$dest/lib/cmake/skv/skvConfig.cmake"
subst cmake/skvConfigVersion.cmake.in "$dest/lib/cmake/skv/skvConfigVersion.cmake"

echo "installed libskv $version into $dest"
