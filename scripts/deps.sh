#!/usr/bin/env bash
# Installs the tools `make test` needs beyond cargo and a C compiler: cmake (the CMake
# consumer), pkg-config (the pkg-config consumer), valgrind (the C suite under valgrind), a
# C++ compiler (the `zmq` feature's libzmq, built from source by zmq-sys) and pip (the NIXL
# wheel of `make nixl-test`, scripts/nixl_fetch.sh).
# A no-op when they are present; on Debian/Ubuntu as root it installs them with apt-get.
set -euo pipefail

missing=()
for tool in cmake pkg-config valgrind; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
command -v c++ >/dev/null || missing+=(g++)
command -v pip >/dev/null || command -v pip3 >/dev/null || missing+=(python3-pip)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "scripts/deps.sh: missing ${missing[*]}: install them with your package manager" >&2
  exit 1
fi
echo "scripts/deps.sh: installing ${missing[*]}"
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
