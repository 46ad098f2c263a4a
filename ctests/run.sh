#!/usr/bin/env bash
# Builds and runs every ctests/test_*.c (C99) and ctests/test_*.cpp (C++17) against
# include/skv.h and libskv.so, after ctests/hpp_complete.sh (skv.hpp wraps all of skv.h).
#   ctests/run.sh [LIBDIR]            LIBDIR defaults to target/release
#   SKV_CTEST_SANITIZE=address        build the C/C++ side with AddressSanitizer
#   SKV_CTEST_SANITIZE=undefined      ... with UndefinedBehaviorSanitizer (any report fails)
#   SKV_CTEST_VALGRIND=1              run each test under valgrind
#   SKV_CTEST_ONLY=test_doc_events.c  run only these tests (a glob; hpp_complete.sh skipped)
# Prints "ctests: N passed, N failed" (test programs) and exits non-zero on any failure.
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
libdir="${1:-target/release}"
case "$libdir" in /*) ;; *) libdir="$root/$libdir" ;; esac
if [ ! -e "$libdir/libskv.so" ]; then
  echo "ctests: $libdir/libskv.so not found (run cargo build --release first)" >&2
  exit 2
fi

mode=plain
san_flags=()
if [ "${SKV_CTEST_SANITIZE:-}" = address ]; then
  mode=asan
  san_flags=(-fsanitize=address -fno-omit-frame-pointer)
elif [ "${SKV_CTEST_SANITIZE:-}" = undefined ]; then
  mode=ubsan
  san_flags=(-fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
elif [ -n "${SKV_CTEST_SANITIZE:-}" ]; then
  echo "ctests: unknown SKV_CTEST_SANITIZE=${SKV_CTEST_SANITIZE}" >&2
  exit 2
fi
runner=()
if [ "${SKV_CTEST_VALGRIND:-0}" = 1 ]; then
  [ "$mode" = plain ] || { echo "ctests: valgrind and a sanitizer do not mix" >&2; exit 2; }
  mode=valgrind
  runner=(valgrind --error-exitcode=1 --leak-check=full -q)
fi

build="$root/target/ctests/$mode"
mkdir -p "$build/lib"
# the library's SONAME (SKV_SONAME), which a cargo target dir does not have: the tests
# load it through a link to the very file they were linked against
soname="$(readelf -d "$libdir/libskv.so" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')"
ln -sfn "$libdir/libskv.so" "$build/lib/${soname:-libskv.so}"
warn=(-Wall -Wextra -Werror -pedantic -g -O1)
link=(-L"$libdir" -lskv -Wl,-rpath,"$build/lib" -pthread)

passed=0
failed=0
# skv.hpp wraps every function of skv.h (a new export without a wrapper fails here).
if [ -n "${SKV_CTEST_ONLY:-}" ]; then
  :
elif "$root/ctests/hpp_complete.sh"; then
  echo "ok   hpp_complete.sh"
  passed=$((passed + 1))
else
  echo "FAIL hpp_complete.sh"
  failed=$((failed + 1))
fi
shopt -s nullglob
if [ -n "${SKV_CTEST_ONLY:-}" ]; then sources=("$root"/ctests/$SKV_CTEST_ONLY); else
  sources=("$root"/ctests/test_*.c "$root"/ctests/test_*.cpp); fi
for src in "${sources[@]}"; do
  [ -e "$src" ] || continue
  name="$(basename "$src")"
  exe="$build/${name%.*}"
  case "$src" in
    *.c) cc=(gcc -std=c99) ;;
    *) cc=(g++ -std=c++17) ;;
  esac
  if ! "${cc[@]}" "${warn[@]}" "${san_flags[@]}" -pthread -I"$root/include" -I"$root/ctests" \
      "$src" -o "$exe" "${link[@]}"; then
    echo "FAIL $name (build)"
    failed=$((failed + 1))
    continue
  fi
  if ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" \
      "${runner[@]}" "$exe"; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    failed=$((failed + 1))
  fi
done

# scripts/contend.c, a timing tool, is built (not run) so that it keeps up with the header.
if gcc -std=c99 "${warn[@]}" "${san_flags[@]}" -pthread -I"$root/include" "$root/scripts/contend.c" \
    -o "$build/contend" "${link[@]}"; then
  echo "ok   scripts/contend.c (built)"
  passed=$((passed + 1))
else
  echo "FAIL scripts/contend.c (build)"
  failed=$((failed + 1))
fi

echo "ctests: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
