#!/usr/bin/env bash
# The test command (README, .ci/run): installs missing dependencies, builds, runs every test through
# ctest, then rebuilds the unit tests with AddressSanitizer + UBSan and reruns the tests that feed
# damaged and hostile input to the reader.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
bash "$root/scripts/install-deps.sh"
BUILD_DIR="$build" bash "$root/scripts/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd "$build" && ctest --output-on-failure -j "$(nproc)")

asan="$build-asan"
cmake -S "$root" -B "$asan" -DUCP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug > "$asan.configure.log" 2>&1 \
  || { cat "$asan.configure.log"; exit 1; }
cmake --build "$asan" -j "$(nproc)" --target ucp_unit_tests ucp-inspect
echo "== AddressSanitizer: reader, writer, inspect and corrupted inputs"
UCP_TEST_WORK="$build/tests/work" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$asan/tests/ucp_unit_tests" "[reader],[writer],[inspect],[corrupt]"
