#!/usr/bin/env bash
# Puts NIXL's C API under DIR (default target/nixl) for `make nixl-test`, pinned here and
# only here: the library from the PyPI wheel, the header from the crates.io crate of the same
# release. Then checks up front that the pair loads and fits; any failure exits non-zero with
# a one-line reason (the test never skips).
#   DIR/lib/libnixl_capi.so, DIR/lib/plugins/libplugin_UCX.so   (the wheel's libraries)
#   DIR/include/nixl_capi.h                                      (the C API they export)
#
# Why NIXL's C API and not the nixl-sys crate: nixl-sys compiles a C++ wrapper with bindgen
# (libclang, C++20) against NIXL's C++ headers, which the wheel does not ship; without them it
# builds stubs that abort at run time. The wheel does ship that wrapper compiled,
# libnixl_capi.so; its declarations are nixl-sys's wrapper.h, taken from the crate of the
# same version (cargo verifies the crate's checksum; pip verifies the wheel's).
set -euo pipefail

NIXL_VERSION=1.5.1
NIXL_WHEEL=nixl-cu12
NIXL_WHEEL_SHA256=341d0dfa499f941c054614252f1d8047d1380e33f29c87707372ff5ec7d3779a
NIXL_WHEEL_PYTHON=3.11      # the wheel's tag (cp311); its libraries do not need that Python
NIXL_WHEEL_PLATFORM=manylinux_2_28_x86_64

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/target/nixl}"
case "$dir" in /*) ;; *) dir="$root/$dir" ;; esac
fail() { echo "nixl_fetch: $*" >&2; exit 1; }

mkdir -p "$dir"
stamp="$dir/.fetched-$NIXL_WHEEL-$NIXL_VERSION"
if [ ! -e "$stamp" ]; then
  rm -rf "$dir/wheel" "$dir/unpacked" "$dir/lib" "$dir/include" "$dir/crate"
  command -v pip >/dev/null || command -v pip3 >/dev/null ||
    fail "pip not found: install python3-pip (the wheel $NIXL_WHEEL==$NIXL_VERSION comes from PyPI)"
  pip=$(command -v pip || command -v pip3)
  printf '%s==%s --hash=sha256:%s\n' "$NIXL_WHEEL" "$NIXL_VERSION" "$NIXL_WHEEL_SHA256" \
    >"$dir/requirements.txt"
  "$pip" download --quiet --no-deps --require-hashes --only-binary=:all: \
    --python-version "$NIXL_WHEEL_PYTHON" --platform "$NIXL_WHEEL_PLATFORM" \
    -r "$dir/requirements.txt" -d "$dir/wheel" ||
    fail "pip download $NIXL_WHEEL==$NIXL_VERSION failed (network, or the pinned hash changed)"
  whl=("$dir"/wheel/*.whl)
  # Only the native libraries (NIXL's, its plugins', UCX's): not the Python packages.
  python3 - "${whl[0]}" "$dir/unpacked" <<'PY' || fail "cannot unpack ${whl[0]}"
import sys, zipfile
libs = (".nixl_cu12.mesonpy.libs/", "nixl_cu12.libs/")
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(libs)])
PY
  rm -rf "$dir/wheel"
  # The libraries find UCX through their RPATH ($ORIGIN/../nixl_cu12.libs): keep the wheel's
  # tree as it is and point at it.
  ln -sfn "unpacked/.nixl_cu12.mesonpy.libs" "$dir/lib"

  # The header: nixl-sys's wrapper.h from the crate of the same version, through cargo.
  mkdir -p "$dir/crate"
  cat >"$dir/crate/Cargo.toml" <<EOF
[package]
name = "nixl-header"
version = "0.0.0"
edition = "2021"
publish = false

[lib]
path = "lib.rs"

[dependencies]
nixl-sys = "=$NIXL_VERSION"

[workspace]
EOF
  : >"$dir/crate/lib.rs"
  cargo fetch --quiet --manifest-path "$dir/crate/Cargo.toml" ||
    fail "cargo fetch of nixl-sys $NIXL_VERSION failed (network?)"
  crate_dir=$(cargo metadata --offline --format-version 1 --manifest-path "$dir/crate/Cargo.toml" |
    python3 -c '
import json, os, sys
pkgs = json.load(sys.stdin)["packages"]
print(next(os.path.dirname(p["manifest_path"]) for p in pkgs if p["name"] == "nixl-sys"))') ||
    fail "nixl-sys $NIXL_VERSION not found after cargo fetch"
  mkdir -p "$dir/include"
  cp "$crate_dir/wrapper.h" "$dir/include/nixl_capi.h"
  touch "$stamp"
fi

lib="$dir/lib/libnixl_capi.so"
[ -e "$lib" ] || fail "$lib missing: the wheel $NIXL_WHEEL==$NIXL_VERSION changed its layout"
ucx="$dir/lib/plugins/libplugin_UCX.so"
[ -e "$ucx" ] || fail "the wheel has no UCX plugin ($ucx)"
missing=$(ldd "$lib" "$ucx" | grep 'not found' || true)
[ -z "$missing" ] ||
  fail "libraries the NIXL wheel needs are missing: $(echo "$missing" | tr -s ' \n' ' ')"
# Every function the header declares is one the library exports: header and library agree.
declared=$(grep -o 'nixl_capi_[a-z_]*(' "$dir/include/nixl_capi.h" | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep '^nixl_capi_' | sort -u)
absent=$(comm -23 <(echo "$declared") <(echo "$exported"))
[ -z "$absent" ] || fail "nixl_capi.h declares what $lib lacks: $(echo "$absent" | tr '\n' ' ')"
python3 - "$lib" <<'EOF' || fail "$lib does not load, or is NIXL's stub build"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.nixl_capi_is_stub.restype = ctypes.c_bool
sys.exit(1 if lib.nixl_capi_is_stub() else 0)
EOF
echo "nixl_fetch: $NIXL_WHEEL $NIXL_VERSION in $dir (header: nixl-sys $NIXL_VERSION wrapper.h)"
