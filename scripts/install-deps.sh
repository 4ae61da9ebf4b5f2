#!/usr/bin/env bash
# Installs ucp's Debian dependencies, only when one is missing (idempotent; needs root or sudo).
# No libtorch-dev: ucp reads DeepSpeed's pickles with its own bounded unpickler (libtorch's rejects
# the classes every DeepSpeed checkpoint holds); python3-torch serves the tests.
set -euo pipefail
packages=(cmake g++ make libopenmpi-dev openmpi-bin libhdf5-openmpi-dev libcli11-dev
          nlohmann-json3-dev catch2 zlib1g-dev libdeflate-dev libxxhash-dev python3-torch python3-numpy python3-jsonschema python3-xxhash
          hdf5-tools python3-h5py clang libclang-rt-14-dev help2man)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
