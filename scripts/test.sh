#!/usr/bin/env bash
# The test command (README, .ci/run): installs missing dependencies, builds, runs every test through
# ctest, then rebuilds with clang, AddressSanitizer + UBSan and libFuzzer's coverage, reruns the tests
# that feed damaged and hostile input to the reader, then runs each libFuzzer harness from that build:
# 15 s each for the three whose readers changed last, 5 s for the others.
#
#   bash scripts/test.sh            everything (CI: .ci/run)
#   bash scripts/test.sh --quick    the inner loop: build and ctest without the tests labelled slow
#                                   (kill-anywhere, layout matrix, reassembly), no sanitizer or fuzzing pass
# The wall time of each phase is printed at the end, whether it passed or not.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: bash scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
phases=()
phase_start=$SECONDS
phase() {  # phase NAME: closes the phase before it under NAME
  phases+=("$(printf '%-34s %5d s' "$1" $((SECONDS - phase_start)))")
  phase_start=$SECONDS
}
report() {
  echo "== wall time per phase"
  for p in "${phases[@]}"; do echo "  $p"; done
  echo "  $(printf '%-34s %5d s' total "$SECONDS")"
}
trap report EXIT
bash "$root/scripts/install-deps.sh"
phase "install-deps"
mkdir -p "$build"
free_gib=$(( $(df -Pk "$build" | awk 'NR==2 {print $4}') / 1048576 ))
if [ "$free_gib" -lt 12 ]; then  # the test outputs, two builds (and the zip64 case's 4 GiB where /dev/shm has no room): 9.2 GiB at the peak, measured with them
  echo "note: $free_gib GiB free under $build; a full run took up to 9.2 GiB of disk here" >&2
fi
BUILD_DIR="$build" bash "$root/scripts/build.sh" -DUCP_BUILD_TESTS=ON  # on, whatever scripts/setup.sh left in the cache
phase "build"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# ctest starts the longest tests first where it knows their times: a fresh build does not, so it gets
# those of a full run here (tests/ctest_costs.txt, ctest's own CTestCostData.txt format; a test it does
# not list is only scheduled later, and ctest updates the file with this run's times).
costs="$build/Testing/Temporary/CTestCostData.txt"
[ -f "$costs" ] || { mkdir -p "$(dirname "$costs")" && cp "$root/tests/ctest_costs.txt" "$costs"; }
# Two tests a core: a test waits on process start-up, mpiexec and the disk for about half its time
# (measured under -j 2 on 2 cores: 1033 s of CPU in 1156 s, the cores half idle).
jobs=$(( 2 * $(nproc) ))
# The Python tests run forked from a process that has imported torch (tests/python/torch_zygote.py),
# which ends when ctest does.
stop_zygote() { /usr/bin/python3 "$root/tests/python/torch_zygote.py" --stop || true; }
if [ "$quick" -eq 1 ]; then
  (cd "$build" && ctest --output-on-failure -j "$jobs" -LE slow) || { stop_zygote; exit 1; }
  stop_zygote
  phase "ctest --quick"
  rm -rf "$(cat "$build/tests/ompi_tmpdir.txt")"
  exit 0
fi

(cd "$build" && ctest --output-on-failure -j "$jobs") || { stop_zygote; exit 1; }
stop_zygote
phase "ctest"
rm -rf "$(cat "$build/tests/ompi_tmpdir.txt")"  # Open MPI's session folders, one per test (tests/CMakeLists.txt)

# One clang build serves the sanitizer tests and the fuzzing: ASan + UBSan over everything, with
# libFuzzer's coverage instrumentation (inert outside a harness), at -O0: clang's optimizer over the
# sanitizers' instrumentation doubled the compile (the library: 413 s of CPU at -O1, half that at -O0),
# which on this machine's 2 cores cost CI more than the slower sanitized runs gain. It compiles after
# ctest, not beside it: with the Python tests forked from one torch import, ctest keeps both cores
# busy (93% here), and a compile beside it, even at the idle scheduling class, lengthened ctest by
# more than the compile takes alone (ctest 794 s alone, 1078-1083 s in the two CI runs beside it).
asan="$build-asan"
# Line tables only (-g1): a sanitizer's report keeps file and line, the compile skips full debug info.
CC=clang CXX=clang++ cmake -S "$root" -B "$asan" -DUCP_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-O0 -g1" -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" > "$asan.configure.log" 2>&1 \
  || { cat "$asan.configure.log"; exit 1; }
# One target (ucp_sanitized, tests/fuzz/CMakeLists.txt): the unit tests, the three tools and the harnesses.
cmake --build "$asan" -j "$(nproc)" --target ucp_sanitized > "$asan.build.log" 2>&1 \
  || { tail -40 "$asan.build.log"; echo "the sanitizer build failed: $asan.build.log" >&2; exit 1; }
phase "sanitizer and fuzzer build"
work="$build/tests/work"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# Two streams side by side, each into a log of its own printed after (they wait on MPI start-up and the
# disk much of their time: 100 s one after the other in the last CI run).
asan_convert_side() {
  echo "== AddressSanitizer: reader, writer, inspect, plans and corrupted inputs"
  UCP_TEST_WORK="$work" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    "$asan/tests/ucp_unit_tests" "[reader],[writer],[inspect],[corrupt],[plan],[rounding],[naming],[buffers],[reshard_plan]"
  echo "== AddressSanitizer: ucp-convert, single process (with leak checks), 2 MPI ranks, 3 with split items, damaged sources"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 /usr/bin/python3 "$root/tests/python/convert_case.py" \
    "$asan/apps/ucp-convert" "$work/fixtures/tp2_pp2_dp2_bf16" "$work/asan/a/universal" 1
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 /usr/bin/python3 "$root/tests/python/convert_errors.py" \
    "$asan/apps/ucp-convert" "$work/fixtures/tp2_dp2" "$work/asan/damaged"
  # OpenMPI's own allocations are not ours to chase: no leak checks under mpirun.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 /usr/bin/python3 "$root/tests/python/convert_case.py" \
    "$asan/apps/ucp-convert" "$work/fixtures/zero3_tp2_dp2_gpt" "$work/asan/b/universal" 2 mpiexec -- --buffer 8K
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 /usr/bin/python3 "$root/tests/python/convert_case.py" \
    "$asan/apps/ucp-convert" "$work/fixtures/tp2_pp2_dp2_bf16" "$work/asan/c/universal" 3 mpiexec -- --buffer 64K --split-above 4K
  echo "== AddressSanitizer: the store conformance suite (.pt and HDF5), the HDF5 store's damaged-file refusals"
  UCP_TEST_WORK="$work" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$asan/tests/ucp_unit_tests" "[store]" "~*garbled*"
  # HDF5 1.10 itself leaks on some error paths of a damaged file (the test checks that no HDF5 id of
  # ours stays open): no leak checks for the garbled-file case.
  UCP_TEST_WORK="$work" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 "$asan/tests/ucp_unit_tests" "*garbled*"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 /usr/bin/python3 "$root/tests/python/hdf5_damaged.py" \
    "$asan/apps/ucp-convert" "$asan/apps/ucp-inspect" "$work/fixtures/tp2_dp2" "$work/asan/hdf5_damaged"
  echo "== AddressSanitizer: --format hdf5 and --from-atomic both ways, single process (with leak checks) and 2 MPI ranks"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 /usr/bin/python3 "$root/tests/python/hdf5_case.py" \
    "$asan/apps/ucp-convert" "$asan/apps/ucp-inspect" "$work/fixtures/zero3_tp2_dp2_gpt" "$work/asan/hdf5_np1" 1
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 /usr/bin/python3 "$root/tests/python/hdf5_case.py" \
    "$asan/apps/ucp-convert" "$asan/apps/ucp-inspect" "$work/fixtures/tp2_pp2_dp2_bf16" "$work/asan/hdf5_np2" 2 mpiexec
}
asan_reshard_side() {
  echo "== AddressSanitizer: ucp-reshard, refusals (with leak checks) and the DP=3 targets"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 /usr/bin/python3 "$root/tests/python/reshard_errors.py" \
    "$asan/apps/ucp-reshard" "$work/reshard/atomic_llama/universal" "$work/asan/reshard_refusals"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 /usr/bin/python3 "$root/tests/python/reshard_matrix.py" \
    "$asan/apps/ucp-reshard" "$work/reshard/atomic_llama/universal" "$work/asan/reshard_matrix" mpiexec --dp 3
  echo "== AddressSanitizer: ucp-reshard's exchange of shared pieces (3 MPI ranks), and from the HDF5 store"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 /usr/bin/python3 "$root/tests/python/reshard_exchange.py" \
    "$asan/apps/ucp-reshard" "$work/reshard/atomic_llama/universal" "$work/asan/reshard_exchange" mpiexec
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 /usr/bin/python3 "$root/tests/python/reshard_stores.py" \
    "$asan/apps/ucp-reshard" "$work/hdf5/tp2_pp2_dp2_bf16-np2/pt/universal" "$work/hdf5/tp2_pp2_dp2_bf16-np2/h5/universal" \
    "$work/asan/reshard_stores" mpiexec 3,2,2,1,bf16 2,2,1,3,fp16
}
asan_convert_side > "$asan.convert-side.log" 2>&1 &
convert_side=$!
asan_reshard_side > "$asan.reshard-side.log" 2>&1 &
reshard_side=$!
sanitized=0
wait $convert_side || sanitized=1
wait $reshard_side || sanitized=1
cat "$asan.convert-side.log" "$asan.reshard-side.log"
stop_zygote  # started again by the sanitizer tests' checks
[ "$sanitized" -eq 0 ] || { echo "a sanitizer test failed (above)" >&2; exit 1; }
phase "sanitizer tests"
echo "== libFuzzer (scripts/fuzz.sh): 15 s for the 3 harnesses whose readers changed last, 5 s for the rest"
UCP_TEST_WORK="$work" FUZZ_BUILD_DIR="$asan" FUZZ_BUILT=1 bash "$root/scripts/fuzz.sh" changed 15 5
phase "fuzzing"
