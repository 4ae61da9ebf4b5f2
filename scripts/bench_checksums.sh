#!/usr/bin/env bash
# Times the checksum libraries ucp could use on one buffer (default 256 MiB, 7 alternating rounds):
# zlib's and libdeflate's CRC-32, libxxhash's XXH64, and memcpy as the floor. Builds the tool first.
# Usage: scripts/bench_checksums.sh [MiB] [rounds]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cmake --build "$root/build" --target ucp_bench_checksums -j2 > /dev/null
"$root/build/tests/ucp_bench_checksums" "${1:-256}" "${2:-7}"
