#!/usr/bin/env bash
# Builds one libFuzzer harness (tests/fuzz/fuzz_NAME.cpp) and runs it for SECONDS.
#
#   scripts/fuzz.sh NAME SECONDS      NAME: zip unpickle torch_file manifest layout patterns atoms_h5 dcp_metadata safetensors
#   scripts/fuzz.sh all SECONDS       each in turn
#   scripts/fuzz.sh changed LONG SHORT  LONG seconds for the 3 harnesses whose readers changed most
#                                     recently (git log of the paths below), SHORT for the rest; as many
#                                     side by side as there are cores
#
# The build (FUZZ_BUILD_DIR, default build-fuzz/) is clang with libFuzzer's coverage, ASan and UBSan
# over the whole library. Seeds come fresh each run from the real DeepSpeed checkpoints
# (../shared/real-deepspeed/cases), the test suite's fixtures and atomic checkpoints (UCP_TEST_WORK,
# default build/tests/work, made by scripts/test.sh), tests/data and patterns/; what the fuzzer
# finds new stays in build-fuzz/corpus/NAME for the next run. A crash, a leak, undefined behaviour
# or an exception other than ucp::Error leaves its input in build-fuzz/crashes/NAME/ and makes this
# script exit 1; each such input becomes a regression test (tests/unit/test_corrupt.cpp).
# The last line printed per harness: executions, coverage (libFuzzer's cov/ft) and corpus size.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
name="${1:?usage: fuzz.sh NAME|all SECONDS}"
seconds="${2:?usage: fuzz.sh NAME|all SECONDS}"
all=(zip unpickle torch_file manifest layout patterns atoms_h5 dcp_metadata safetensors)
# The code each harness's inputs reach first (its reader), for `changed`.
declare -A reads=(
  [zip]="lib/pt/zip_archive.cpp lib/pt/zip_archive.h tests/fuzz/fuzz_zip.cpp"
  [unpickle]="lib/pt/unpickler.cpp lib/pt/unpickler.h lib/pt/value.cpp lib/pt/value.h tests/fuzz/fuzz_unpickle.cpp"
  [torch_file]="lib/pt tests/fuzz/fuzz_torch_file.cpp"
  [manifest]="lib/store lib/inspect lib/core/json_schema.cpp schemas tests/fuzz/fuzz_manifest.cpp"
  [layout]="lib/layout tests/fuzz/fuzz_layout.cpp"
  [patterns]="lib/patterns patterns tests/fuzz/fuzz_patterns.cpp"
  [atoms_h5]="lib/store/atom_store_h5.cpp lib/h5 tests/fuzz/fuzz_atoms_h5.cpp"
  [dcp_metadata]="lib/formats/dcp tests/fuzz/fuzz_dcp_metadata.cpp"
  [safetensors]="lib/safetensors/read.cpp lib/formats/hf/import_config.cpp lib/formats/hf/import_driver.cpp tests/fuzz/fuzz_safetensors.cpp"
)
if [ "$name" = changed ]; then
  long="$seconds"
  short="${3:?usage: fuzz.sh changed LONG SHORT}"
  ranked="$(for n in "${all[@]}"; do
    # shellcheck disable=SC2086
    t="$(git -C "$root" log -1 --format=%ct -- ${reads[$n]} 2>/dev/null || true)"
    echo "${t:-0} $n"
  done | sort -rn -k1,1 -s | awk '{print $2}')"
  echo "fuzz.sh: most recently changed readers first: $(echo $ranked)"
  # Built once, then run as many at a time as there are cores (each harness is one thread; each has its
  # own seeds, corpus and temporary folder), their reports printed in the ranked order.
  build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
  targets=()
  for n in $ranked; do targets+=("fuzz_$n"); done
  if [ ! -f "$build/CMakeCache.txt" ]; then bash "$0" "${ranked%%[[:space:]]*}" 0 > /dev/null; fi  # configures the build
  # FUZZ_BUILT=1: the caller built them (scripts/test.sh, through the ucp_sanitized target).
  [ "${FUZZ_BUILT:-0}" = 1 ] || cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" > "$build.build.log" 2>&1 \
    || { tail -40 "$build.build.log"; exit 1; }
  status=0
  i=0
  pids=()
  for n in $ranked; do
    s="$short"
    [ "$i" -lt 3 ] && s="$long"
    i=$((i + 1))
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 0.2; done
    FUZZ_BUILT=1 bash "$0" "$n" "$s" > "$build/fuzz_run_$n.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  for n in $ranked; do cat "$build/fuzz_run_$n.out"; done
  exit $status
fi
if [ "$name" = all ]; then
  status=0
  for n in "${all[@]}"; do bash "$0" "$n" "$seconds" || status=1; done
  exit $status
fi
case " ${all[*]} " in *" $name "*) ;; *) echo "fuzz.sh: unknown harness '$name' (one of: ${all[*]})" >&2; exit 2 ;; esac

build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
work="${UCP_TEST_WORK:-$root/build/tests/work}"
real="$root/../shared/real-deepspeed/cases"
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DUCP_FUZZ=ON -DUCP_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
fi
[ "${FUZZ_BUILT:-0}" = 1 ] || cmake --build "$build" --target "fuzz_$name" -j "$(nproc)" > "$build.build.log" 2>&1 || { tail -40 "$build.build.log"; exit 1; }
[ "$seconds" -gt 0 ] || exit 0  # the build only

seeds="$build/seeds/$name"
corpus="$build/corpus/$name"
crashes="$build/crashes/$name"
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$crashes"
first_lines() { local f; f="$(mktemp)"; cat > "$f"; sed -n "1,$1p" "$f"; rm -f "$f"; }
small_pt() {  # .pt files of at most 256 KiB, real ones first: at most 200
  local list="$build/seeds/$name.pt.list"  # one per harness: harnesses may run side by side
  find "$real" "$work/fixtures" "$root/tests/data" -name '*.pt' -size -256k > "$list" 2>/dev/null || true
  sed -n 1,200p "$list"
}
seed_n=0
add() { cp "$1" "$seeds/$((seed_n++))-$(basename "$1")"; }
case "$name" in
  zip|torch_file)
    while read -r f; do add "$f"; done < <(small_pt) ;;
  unpickle)
    small_pt | /usr/bin/python3 -c '
import sys, zipfile
for i, path in enumerate(sys.stdin.read().split()):
    with zipfile.ZipFile(path) as z:
        for n in z.namelist():
            if n.endswith("data.pkl"):
                open(f"{sys.argv[1]}/{i}.pkl", "wb").write(z.read(n))
' "$seeds" ;;
  manifest)
    while read -r f; do add "$f"; done < <(find "$work" -name ucp_manifest.json -size -256k 2>/dev/null | first_lines 100) ;;
  layout)
    add "$root/tests/data/layout_example.json"
    while read -r f; do add "$f"; done < <(find "$work" -name '*.json' -path '*layout*' 2>/dev/null | first_lines 20) ;;
  patterns)
    for f in "$root"/patterns/*.json; do add "$f"; done ;;
  dcp_metadata)  # the real DCP cases' .metadata, beside the first case's data files
    dcp="$root/../shared/real-dcp/cases"
    for f in "$dcp"/*/checkpoint/.metadata; do cp "$f" "$seeds/$((seed_n++))-metadata"; done
    export UCP_FUZZ_DCP="$(dirname "$(ls "$dcp"/*/checkpoint/.metadata | head -1)")" ;;
  safetensors)  # tests/data/real-hf's files and indexes (transformers' own), the hf_import test's models
    while read -r f; do add "$f"; done < <(find "$root/tests/data/real-hf" "$work/hf_import/models" \( -name '*.safetensors' -o \
      -name 'model.safetensors.index.json' \) -size -256k 2>/dev/null | first_lines 40) ;;
  atoms_h5)
    h5="$(find "$work" -name atoms.h5 -path '*/h5/universal/*' -size -1M 2>/dev/null | first_lines 1)"
    [ -n "$h5" ] || h5="$(find "$work" -name atoms.h5 -path '*/damaged/good/*' 2>/dev/null | first_lines 1)"
    if [ -z "$h5" ]; then
      echo "fuzz.sh: no atoms.h5 under $work to seed from: run scripts/test.sh first" >&2
      exit 1
    fi
    add "$h5"
    export UCP_FUZZ_MANIFEST="$(dirname "$h5")/ucp_manifest.json" ;;
esac
if [ "$(ls -A "$seeds")" = "" ]; then
  echo "fuzz.sh: no seeds for $name (run scripts/test.sh first, for the fixtures)" >&2
  exit 1
fi

log="$build/fuzz_$name.log"
TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/ucp-fuzz-run.XXXXXX")"  # this harness's own: others may run beside it
export TMPDIR
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
set +e
"$build/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
  -artifact_prefix="$crashes/" "$corpus" "$seeds" > "$log" 2>&1
rc=$?
set -e
rm -rf "$TMPDIR" 2>/dev/null || true
execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
last="$(grep -E '^#[0-9]+' "$log" | tail -1)"
echo "fuzz_$name: ${seconds}s, ${execs:-?} executions, $(ls "$seeds" | wc -l) seeds; last: ${last:-none}"
if [ $rc -ne 0 ]; then
  echo "fuzz_$name: FAILED (exit $rc); input(s) in $crashes/, log $log:" >&2
  grep -E 'ERROR|SUMMARY|escaped|deadly|==[0-9]+==' "$log" | head -20 >&2
  exit 1
fi
