#!/usr/bin/env bash
# Installs libskv into a staging prefix and checks it the way its users consume it:
# the install layout and SONAME, debug info (none by default, a separate file with
# --debug-info), the exported symbols, the headers alone and in two translation units, a
# CMake find_package consumer (ctest: shared, static, and a dlopen program linking only
# skv::headers, plain and given the library's directory), pkg-config consumers (shared with
# an rpath, static through skv-static.pc) and a dlopen consumer (found through
# LD_LIBRARY_PATH, an rpath, or a path; under AddressSanitizer, which run paths serve).
# Ends with "integration: N passed, N failed"; non-zero on any failure.
#
# usage: ctests/integration.sh [--no-build]   (--no-build: the release build exists)
# needs: cc, c++, cmake >= 3.16, pkg-config, readelf, nm, valgrind
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work="${CARGO_TARGET_DIR:-$root/target}/integration"
prefix="$work/stage"
logs="$work/logs"
install_args=()
for arg in "$@"; do
  case "$arg" in
    --no-build) install_args+=(--no-build) ;;
    *) echo "usage: ctests/integration.sh [--no-build]" >&2; exit 2 ;;
  esac
done

rm -rf "$work"
mkdir -p "$logs"
passed=0
failed=0

# step NAME COMMAND...: runs COMMAND with its output in logs/NAME.log, shown on failure.
step() {
  local name=$1
  shift
  if "$@" >"$logs/$name.log" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    tail -n 60 "$logs/$name.log" | sed 's/^/     /'
  fi
}

finish() {
  echo "integration: $passed passed, $failed failed"
  exit $((failed > 0))
}

CC=${CC:-cc}
CXX=${CXX:-c++}
strict=(-Wall -Wextra -Werror -pedantic)
inc="$prefix/include"
lib="$prefix/lib"

step install "$root/scripts/install.sh" "${install_args[@]}" "$prefix"
[ "$failed" -eq 0 ] || finish # nothing below can work without the install

# Every version fact as the installed header states it (build.rs derived them all from the
# crate version); the steps below check that the installed files agree with it.
define() { sed -n "s/^#define $1 \(.*\)\$/\1/p" "$inc/skv.h" | tr -d '"'; }
version=$(define SKV_VERSION)
major=$(define SKV_VERSION_MAJOR)
minor=$(define SKV_VERSION_MINOR)
full="$major.$minor.$(define SKV_VERSION_PATCH)"
abi=$(define SKV_ABI_VERSION)
soname=$(define SKV_SONAME)
real="$lib/libskv.so.$full"

# The one rule (build.rs): 0.y -> libskv.so.0.y, ABI y; x.y (x >= 1) -> libskv.so.x, ABI 1000x.
version_rule() {
  echo "SKV_VERSION=$version SKV_ABI_VERSION=$abi SKV_SONAME=$soname"
  [ -n "$version" ] && [ -n "$abi" ] && [ -n "$soname" ] || { echo "version macros missing from skv.h"; return 1; }
  case "$version" in "$full"|"$full"[-+]*) ;; *) echo "SKV_VERSION $version is not $full"; return 1 ;; esac
  if [ "$major" = 0 ]; then
    [ "$soname" = "libskv.so.0.$minor" ] && [ "$abi" = "$minor" ]
  else
    [ "$soname" = "libskv.so.$major" ] && [ "$abi" = "$((1000 * major))" ]
  fi || { echo "SONAME/ABI do not follow the rule for $version"; return 1; }
  grep -qxF "Version: $version" "$lib/pkgconfig/skv.pc" || { echo "skv.pc Version is not $version"; return 1; }
  grep -qxF "Version: $version" "$lib/pkgconfig/skv-static.pc" || { echo "skv-static.pc Version is not $version"; return 1; }
  grep -qF "set(PACKAGE_VERSION \"$version\")" "$lib/cmake/skv/skvConfigVersion.cmake" ||
    { echo "skvConfigVersion.cmake is not $version"; return 1; }
  grep -qF "IMPORTED_SONAME \"$soname\"" "$lib/cmake/skv/skvConfig.cmake" ||
    { echo "skvConfig.cmake does not name $soname"; return 1; }
}
step version_rule version_rule

layout() {
  local f
  for f in "$real" "$lib/libskv.a" "$inc/skv.h" "$inc/skv.hpp" "$lib/pkgconfig/skv.pc" \
           "$lib/pkgconfig/skv-static.pc" \
           "$lib/cmake/skv/skvConfig.cmake" "$lib/cmake/skv/skvConfigVersion.cmake"; do
    [ -f "$f" ] || { echo "missing $f"; return 1; }
  done
  [ "$(readlink "$lib/$soname")" = "libskv.so.$full" ] || { echo "$soname does not name libskv.so.$full"; return 1; }
  [ "$(readlink "$lib/libskv.so")" = "$soname" ] || { echo "libskv.so does not name $soname"; return 1; }
  # skv.pc finds its prefix from its own place: the headers it names are the installed ones
  local inc_pc
  inc_pc=$(PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --variable=includedir skv) || return 1
  [ -f "$inc_pc/skv.h" ] || { echo "skv.pc names include dir $inc_pc without skv.h"; return 1; }
}
step layout layout

soname_check() {
  readelf -d "$real"
  readelf -d "$real" | grep -qF "Library soname: [$soname]"
}
step soname soname_check

# Installed without debug info by default (install.sh --debug-info keeps it in lib/.debug).
# grep reads all of readelf's output: with -q it could stop early, readelf would die of
# SIGPIPE and pipefail would turn a match into a failure.
no_debug_info() {
  local f
  for f in "$real" "$lib/libskv.a"; do
    if readelf -S "$f" | grep -F '.debug_' >/dev/null; then echo "$f has debug sections"; return 1; fi
  done
  ls -l "$real" "$lib/libskv.a"
}
step no_debug_info no_debug_info

# --debug-info: the .so still has none, its debug info is a separate file that
# .gnu_debuglink names, and libskv.a keeps its own.
debug_info() {
  local dprefix="$work/stage_debug" dlib so debug
  "$root/scripts/install.sh" --no-build --debug-info "$dprefix" || return 1
  dlib="$dprefix/lib"
  so="$dlib/libskv.so.$full"
  debug="$dlib/.debug/libskv.so.$full.debug"
  [ -f "$debug" ] || { echo "missing $debug"; return 1; }
  if readelf -S "$so" | grep -F '.debug_' >/dev/null; then echo "$so has debug sections"; return 1; fi
  readelf -S "$debug" | grep -F '.debug_line' >/dev/null || { echo "$debug has no .debug_line"; return 1; }
  readelf --string-dump=.gnu_debuglink "$so" | grep -F "libskv.so.$full.debug" >/dev/null ||
    { echo "$so has no .gnu_debuglink to libskv.so.$full.debug"; return 1; }
  readelf -S "$dlib/libskv.a" | grep -F '.debug_' >/dev/null || { echo "--debug-info stripped libskv.a"; return 1; }
  ls -l "$so" "$debug" "$dlib/libskv.a"
}
step debug_info debug_info

# A cdylib's version script exports only its #[no_mangle] functions; anything else
# (Rust std, allocator shims, dependencies' symbols) is a leak.
exports() {
  local names leaks
  names=$(nm -D --defined-only "$real" | awk '{print $NF}' | sed 's/@.*//' | sort -u)
  leaks=$(echo "$names" | grep -vE '^(skv_[A-Za-z0-9_]+|_init|_fini|__bss_start|_edata|_end)$' || true)
  echo "$names" | grep -c '^skv_' | sed 's/^/skv_* symbols exported: /'
  [ -z "$leaks" ] || { echo "non-skv symbols exported:"; echo "$leaks"; return 1; }
  echo "$names" | grep -qx skv_get_api || { echo "skv_get_api not exported"; return 1; }
}
step exports exports

# The dlopen table has one entry per exported function: its fields, as skv.h declares
# them, against the library's skv_* symbols (abi_version_fn is skv_abi_version, the
# plain name being the table's own version field).
api_table() {
  local fields syms
  fields=$(sed -n '/^typedef struct skv_api {/,/^} skv_api;/p' "$inc/skv.h" |
           grep -oE '\(\*[a-z0-9_]+\)' | tr -d '(*)' | sed 's/^abi_version_fn$/abi_version/' | sort)
  syms=$(nm -D --defined-only "$real" | awk '{print $NF}' | sed -n 's/@.*//; s/^skv_//p' | sort -u)
  [ -n "$fields" ] || { echo "no function pointer fields in skv_api"; return 1; }
  diff <(echo "$fields") <(echo "$syms") && echo "$(echo "$fields" | wc -l) entries"
}
step api_table api_table

header_alone() {
  echo '#include <skv.h>' | "$CC" -x c -std=c99 "${strict[@]}" -fsyntax-only -I"$inc" - &&
  echo '#include <skv.h>' | "$CXX" -x c++ -std=c++17 "${strict[@]}" -fsyntax-only -I"$inc" - &&
  echo '#include <skv.hpp>' | "$CXX" -x c++ -std=c++17 "${strict[@]}" -Wshadow -Wconversion \
    -fsyntax-only -I"$inc" -
}
step header_alone header_alone

# The three TUs of header_twice as one program; $1: c or c++.
header_twice() {
  local out="$work/header_twice_$1" src="$root/ctests/header_twice" compiler flags
  if [ "$1" = c ]; then compiler=$CC; flags=(-x c -std=c99); else compiler=$CXX; flags=(-x c++ -std=c++17); fi
  "$compiler" "${flags[@]}" "${strict[@]}" -I"$inc" "$src/tu_a.c" "$src/tu_b.c" "$src/main.c" \
    -x none -L"$lib" -lskv -Wl,-rpath,"$lib" -o "$out" && "$out"
}
step header_twice_c99 header_twice c
step header_twice_cxx17 header_twice c++

cmake_consumer() {
  local build="$work/cmake"
  command -v cmake >/dev/null || { echo "cmake is not installed (apt-get install -y cmake)"; return 1; }
  cmake -S "$root/ctests/cmake" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug &&
  cmake --build "$build" -j 2 &&
  ctest --test-dir "$build" --output-on-failure &&
  # skv::headers carries no library: the dlopen programs must not need libskv
  for exe in dlopen_c dlopen_c_libdir; do
    if readelf -d "$build/$exe" | grep 'NEEDED.*libskv'; then echo "$exe links libskv"; return 1; fi
  done
}
step cmake cmake_consumer

# CMake's build-tree run path serves linked libraries only: the skv::headers program carries
# none, so dlopen(SKV_SONAME) finds no library outside the loader's path (docs/building.md's
# recipe, dlopen_c_libdir, passes the directory instead), unless ldconfig knows libskv.
cmake_dlopen_no_path() {
  local exe="$work/cmake/dlopen_c"
  if readelf -d "$exe" | grep -E 'R(UN)?PATH'; then echo "dlopen_c carries a run path"; return 1; fi
  if ldconfig -p 2>/dev/null | grep -F "$soname" >/dev/null; then echo "$soname is on the system path: not checked"; return 0; fi
  if env -u LD_LIBRARY_PATH "$exe"; then echo "dlopen_c found libskv with no path to it"; return 1; fi
  env -u LD_LIBRARY_PATH "$work/cmake/dlopen_c_libdir"
}
step cmake_dlopen_no_path cmake_dlopen_no_path

# find_package(skv VERSION) accepts exactly the versions with this SONAME: 0.y takes 0.y.*
# requests (SameMinorVersion), x.y takes x.* (SameMajorVersion); never a newer one.
find_version() {
  local want=$1 expect=$2 dir="$work/find_version/${1//[^0-9A-Za-z.]/_}" out
  mkdir -p "$dir/src" &&
  printf 'cmake_minimum_required(VERSION 3.16)\nproject(find_skv NONE)\nfind_package(skv %s CONFIG REQUIRED)\n' \
    "$want" >"$dir/src/CMakeLists.txt" || return 1
  if out=$(cmake -S "$dir/src" -B "$dir/build" -DCMAKE_PREFIX_PATH="$prefix" 2>&1); then
    echo "$out"
    [ "$expect" = ok ] || { echo "find_package(skv $want) accepted $version"; return 1; }
  else
    echo "$out"
    [ "$expect" = fail ] || { echo "find_package(skv $want) refused $version"; return 1; }
    # refused for its version, not for anything else
    echo "$out" | tr -s " \n" "  " | grep -q "compatible with requested version" || { echo "failed for another reason"; return 1; }
  fi
}
if [ "$major" = 0 ]; then
  step find_same_minor find_version "0.$minor" ok
  step find_same_minor_range find_version "0.$minor...<0.$((minor + 1))" ok
  step find_next_minor find_version "0.$((minor + 1))" fail
  [ "$minor" -gt 0 ] && step find_older_minor find_version "0.$((minor - 1))" fail
  [ "$minor" -gt 0 ] && step find_older_minor_range find_version "0.$((minor - 1))...<0.$((minor + 1))" fail
else
  step find_same_major find_version "$major.0" ok
  step find_older_major find_version "$((major - 1)).$minor" fail
fi
step find_any_version find_version "" ok

# needs_libskv EXE: the executable's NEEDED entries name libskv's SONAME.
needs_libskv() { readelf -d "$1" | grep -qF "Shared library: [$soname]"; }

# A prefix outside the loader's search path: the program carries an rpath (README.md's form)
# and runs with no LD_LIBRARY_PATH.
pkgconfig_consumer() {
  local out="$work/pkgconfig_test" libdir
  local -x PKG_CONFIG_PATH="$lib/pkgconfig"
  pkg-config --modversion skv &&
  [ "$(pkg-config --modversion skv)" = "$version" ] || return 1
  libdir=$(pkg-config --variable=libdir skv)
  # shellcheck disable=SC2046 # pkg-config's output is meant to be split
  "$CC" -std=c99 "${strict[@]}" "$root/ctests/pkgconfig/main.c" $(pkg-config --cflags --libs skv) \
    -Wl,-rpath,"$libdir" -o "$out" || return 1
  needs_libskv "$out" || { echo "pkgconfig_test does not need $soname"; return 1; }
  readelf -d "$out" | grep -E 'R(UN)?PATH' | grep -qF "$libdir" || { echo "no rpath $libdir"; return 1; }
  env -u LD_LIBRARY_PATH "$out"
}
step pkgconfig pkgconfig_consumer

# Without the rpath the loader does not find the prefix's library (so docs/building.md's
# guidance is needed), unless libskv is also installed where ldconfig looks.
pkgconfig_no_rpath() {
  local out="$work/pkgconfig_no_rpath"
  local -x PKG_CONFIG_PATH="$lib/pkgconfig"
  # shellcheck disable=SC2046
  "$CC" -std=c99 "${strict[@]}" "$root/ctests/pkgconfig/main.c" $(pkg-config --cflags --libs skv) \
    -o "$out" || return 1
  if ldconfig -p 2>/dev/null | grep -F "$soname" >/dev/null; then echo "$soname is on the system path: not checked"; return 0; fi
  if env -u LD_LIBRARY_PATH "$out"; then echo "ran without an rpath or LD_LIBRARY_PATH"; return 1; fi
  LD_LIBRARY_PATH="$lib" "$out"
}
step pkgconfig_no_rpath pkgconfig_no_rpath

# libskv.a through skv-static.pc, with and without --static: no libskv.so needed.
pkgconfig_static() {
  local out="$work/pkgconfig_static" mode
  local -x PKG_CONFIG_PATH="$lib/pkgconfig"
  for mode in "" --static; do
    # shellcheck disable=SC2086 # $mode is one flag or none
    echo "pkg-config $mode --libs skv-static: $(pkg-config $mode --libs skv-static)"
    # shellcheck disable=SC2046,SC2086
    "$CC" -std=c99 "${strict[@]}" "$root/ctests/pkgconfig/main.c" \
      $(pkg-config $mode --cflags --libs skv-static) -o "$out" || return 1
    if readelf -d "$out" | grep 'NEEDED.*libskv'; then
      echo "linked with pkg-config $mode skv-static, the program needs libskv.so"; return 1
    fi
    nm "$out" | grep -x '[0-9a-f]* T skv_cache_new' >/dev/null || { echo "skv_cache_new is not in the program"; return 1; }
    env -u LD_LIBRARY_PATH "$out" || return 1
  done
  # docs/building.md's warning, checked: --static with skv.pc still takes the shared library.
  # shellcheck disable=SC2046
  "$CC" -std=c99 "${strict[@]}" "$root/ctests/pkgconfig/main.c" $(pkg-config --static --cflags --libs skv) \
    -o "$out.shared" && needs_libskv "$out.shared" || { echo "pkg-config --static skv no longer links libskv.so: update docs/building.md"; return 1; }
}
step pkgconfig_static pkgconfig_static

dlopen_consumer() {
  local out="$work/dlopen_test"
  "$CC" -std=c99 "${strict[@]}" -I"$inc" "$root/ctests/dlopen/main.c" -ldl -o "$out" || return 1
  if readelf -d "$out" | grep -q 'NEEDED.*libskv'; then echo "dlopen_test links libskv"; return 1; fi
  LD_LIBRARY_PATH="$lib" "$out" && "$out" "$real"
}
step dlopen dlopen_consumer

# dlopen(SKV_SONAME) from a program linked with -Wl,-rpath,PREFIX/lib: found through the
# executable's own run path, no LD_LIBRARY_PATH.
dlopen_rpath() {
  local out="$work/dlopen_rpath"
  "$CC" -std=c99 "${strict[@]}" -I"$inc" "$root/ctests/dlopen/main.c" -ldl -Wl,-rpath,"$lib" -o "$out" &&
  env -u LD_LIBRARY_PATH "$out"
}
step dlopen_rpath dlopen_rpath

# Under AddressSanitizer with its shared runtime (gcc's default), dlopen is libasan.so's
# interceptor: glibc searches the DT_RUNPATH of the object that called dlopen, which is then
# libasan.so, not the program, so the program's RUNPATH (what ld writes for -rpath by
# default) finds nothing. An old-style DT_RPATH (-Wl,--disable-new-dtags) is still searched
# (glibc also reads the executable's DT_RPATH), and a path needs no search at all. With the
# runtime linked into the program (gcc -static-libasan, clang's default) the RUNPATH serves.
dlopen_asan() {
  local out="$work/dlopen_asan" asan_so ok=0
  local -x ASAN_OPTIONS=detect_leaks=1
  local build=("$CC" -std=c99 "${strict[@]}" -fsanitize=address -fno-omit-frame-pointer -I"$inc"
               "$root/ctests/dlopen/main.c" -ldl)
  "${build[@]}" -Wl,-rpath,"$lib" -Wl,--enable-new-dtags -o "$out.runpath" &&
  "${build[@]}" -Wl,-rpath,"$lib" -Wl,--disable-new-dtags -o "$out.rpath" &&
  "${build[@]}" -DSKV_LIBDIR="\"$lib\"" -o "$out.libdir" || return 1
  readelf -d "$out.runpath" | grep -q RUNPATH || { echo "no RUNPATH in $out.runpath"; return 1; }
  readelf -d "$out.rpath" | grep -q 'RPATH' && ! readelf -d "$out.rpath" | grep -q RUNPATH ||
    { echo "no DT_RPATH alone in $out.rpath"; return 1; }
  env -u LD_LIBRARY_PATH "$out.rpath" || return 1
  env -u LD_LIBRARY_PATH "$out.libdir" || return 1
  asan_so=$(readelf -d "$out.runpath" | grep -o 'libasan\.so[.0-9]*' || true)
  if ldconfig -p 2>/dev/null | grep -F "$soname" >/dev/null; then
    echo "$soname is on the system path: the RUNPATH case is not checked"; return 0
  fi
  if env -u LD_LIBRARY_PATH "$out.runpath"; then ok=1; fi
  if [ -n "$asan_so" ] && [ "$ok" = 1 ]; then echo "dlopen through $asan_so used the program's RUNPATH"; return 1; fi
  if [ -z "$asan_so" ] && [ "$ok" = 0 ]; then echo "static ASan runtime, yet the RUNPATH did not serve"; return 1; fi
  echo "ASan runtime ${asan_so:-linked in}: RUNPATH $([ "$ok" = 1 ] && echo served || echo ignored)"
}
step dlopen_asan dlopen_asan

# The same programs under valgrind: no invalid access, no leak across the boundary.
vg=(valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,possible -q)
step valgrind_dlopen env LD_LIBRARY_PATH="$lib" "${vg[@]}" "$work/dlopen_test"
step valgrind_cmake_cpp "${vg[@]}" "$work/cmake/turn_cpp"

# skvConfig.cmake finds the prefix from its own location: a moved install still works.
relocated() {
  local moved="$work/moved" build="$work/cmake_moved"
  mv "$prefix" "$moved" &&
  cmake -S "$root/ctests/cmake" -B "$build" -DCMAKE_PREFIX_PATH="$moved" &&
  grep -q "skv_DIR:PATH=$moved/lib/cmake/skv" "$build/CMakeCache.txt" &&
  cmake --build "$build" -j 2 &&
  ctest --test-dir "$build" --output-on-failure
}
step cmake_relocated relocated

finish
