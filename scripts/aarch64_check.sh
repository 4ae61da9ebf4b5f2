#!/usr/bin/env bash
# Proves ucp on aarch64 (GH200 / Grace) without an arm64 machine: cross-builds ucp for arm64 with Debian's
# cross compiler against an arm64 Debian sysroot (built once with debootstrap, then cached), runs the arm64
# binaries under qemu-user, and compares what they write with the x86-64 build's output byte for byte.
#
#   bash scripts/aarch64_check.sh            # on Debian bookworm, as root (it installs what it needs with apt)
#
# Phases, each timed and reported PASS / FAIL / SKIP in the summary at the end (exit 1 on any FAIL):
#   host-packages  scripts/install-deps.sh, then g++-aarch64-linux-gnu, qemu-user, debootstrap
#   sysroot        arm64 Debian packages (libopenmpi-dev, libhdf5-openmpi-dev, zlib1g-dev, libdeflate-dev,
#                  libxxhash-dev, libstdc++-dev, CLI11, nlohmann-json, catch2) unpacked into CACHE/sysroot-SUITE;
#                  reused while its package list is unchanged (the host's amd64 packages are not touched)
#   binfmt         registers qemu-aarch64 for arm64 executables (binfmt_misc), so that mpirun can start arm64
#                  ranks; where that is not allowed, the 2-rank runs are skipped and everything else still runs
#   build-x86      scripts/build.sh into BUILD_DIR (default build/): the reference
#   build-arm64    scripts/aarch64-linux-gnu.cmake into CACHE/build-aarch64
#   fixtures       the x86 build's ctest steps that write the unit tests' inputs (python3-torch on the host)
#   unit-arm64     every ctest unit test (ucp_unit_tests "[tag]") with the arm64 binary, each its own line;
#                  then the files the arm64 writer tests wrote, loaded by torch.load on the host
#   sample-*       tests/data/sample_llama_tp2_pp2_dp2_bf16 through both builds, in the same folder:
#                  ucp-convert on 1 rank (.pt and hdf5 stores) and 2 ranks, ucp-inspect --verify,
#                  ucp-reshard --dp 2 --tp 1 --pp 1 --zero-stage 1 (1 and 2 ranks); every output file equal
#                  byte for byte, ucp_manifest.json equal but for "created" (the time of the run)
#   compare-builds scripts/compare_builds.py --quick with both builds (UCP_AARCH64_COMPARE=quick, the
#                  default; =all for every real case; =none to skip): every output and message of many cases
#
# Environment: UCP_AARCH64_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/ucp-aarch64) holds the sysroot, the
# arm64 build and the work folders; BUILD_DIR the x86 build; UCP_CMAKE_ARGS extra cmake arguments for both
# builds (e.g. "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"); UCP_AARCH64_MIRROR the Debian mirror;
# UCP_AARCH64_LARGE=1 also runs the 4 GiB zip64 reader test (needs 5 GiB of disk); UCP_AARCH64_PHASES="a b"
# runs only the phases named (the others taken as done by an earlier run).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${UCP_AARCH64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ucp-aarch64}"
x86="${BUILD_DIR:-$root/build}"
arm="$cache/build-aarch64"
mirror="${UCP_AARCH64_MIRROR:-http://deb.debian.org/debian}"
suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
sysroot="$cache/sysroot-$suite"
compare="${UCP_AARCH64_COMPARE:-quick}"
read -r -a cmake_args <<< "${UCP_CMAKE_ARGS:-}"
py=/usr/bin/python3  # Debian's, with python3-torch (not a python3 earlier on PATH)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# qemu-aarch64 (directly, and as binfmt_misc's interpreter) finds the arm64 loader and libraries here.
export QEMU_LD_PREFIX="$sysroot"
mkdir -p "$cache"
log_dir="$cache/logs"
mkdir -p "$log_dir"

# ---- phase bookkeeping: name, result, seconds, note -------------------------------------------------------
names=() results=() seconds=() notes=()
record() { names+=("$1"); results+=("$2"); seconds+=("$3"); notes+=("${4:-}"); }
# phase NAME FUNCTION: runs FUNCTION, its output into logs/NAME.log (shown on failure), and records it. A
# function that returns 3 (SKIP) sets $skip_note; any other non-zero status is a FAIL.
phase() {
  local name=$1 fn=$2 start status log="$log_dir/$1.log"
  start=$(date +%s.%N)
  echo "== $name"
  skip_note="" fail_note=""
  set +e
  ( set -euo pipefail; "$fn" ) > "$log" 2>&1
  status=$?
  set -e
  local took
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ $status -eq 0 ]; then
    record "$name" PASS "$took" "$(tail -n 1 "$log")"
  elif [ $status -eq 3 ]; then
    record "$name" SKIP "$took" "$(tail -n 1 "$log")"
  else
    record "$name" FAIL "$took" "$(tail -n 1 "$log") (log: $log)"
    echo "-- $name failed; the end of $log:"
    tail -n 30 "$log" | sed 's/^/   /'
  fi
  echo "   ${results[-1]} in ${took}s: ${notes[-1]}"
  return 0
}
# UCP_AARCH64_PHASES="unit-arm64 sample-reshard" runs only those phases, taking the others as done earlier.
only="${UCP_AARCH64_PHASES:-}"
wanted() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }
passed() {  # passed NAME: whether phase NAME passed (or was not wanted in this run)
  local i
  wanted "$1" || return 0
  for i in "${!names[@]}"; do [ "${names[$i]}" = "$1" ] && [ "${results[$i]}" = PASS ] && return 0; done
  return 1
}

# ---- host-packages --------------------------------------------------------------------------------------
host_packages() {
  bash "$root/scripts/install-deps.sh"
  local want=(g++-aarch64-linux-gnu qemu-user debootstrap) missing=() p
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  aarch64-linux-gnu-g++ --version | head -n 1
  qemu-aarch64 --version | head -n 1
  # The project's own build needs the amd64 -dev packages: they must still be there.
  dpkg-query -W -f='${Package}:${Architecture} ${Status}\n' libopenmpi-dev libhdf5-openmpi-dev | grep -c "install ok installed" \
    | grep -qx 2 || { echo "libopenmpi-dev / libhdf5-openmpi-dev (amd64) are not installed"; return 1; }
  echo "host tools present; amd64 libopenmpi-dev and libhdf5-openmpi-dev installed"
}

# ---- sysroot --------------------------------------------------------------------------------------------
sysroot_packages() {
  local gcc_major
  gcc_major="$(aarch64-linux-gnu-gcc -dumpversion | cut -d. -f1)"
  # The sysroot's C++ library matches the cross compiler's version (its headers are taken from the sysroot).
  echo "libopenmpi-dev,openmpi-bin,libhdf5-openmpi-dev,zlib1g-dev,libdeflate-dev,libxxhash-dev,libcli11-dev,nlohmann-json3-dev,catch2,libstdc++-$gcc_major-dev"
}
build_sysroot() {
  local pkgs stamp tmp
  pkgs="$(sysroot_packages)"
  stamp="$suite $mirror $pkgs"
  if [ -f "$sysroot/.ucp-sysroot" ] && [ "$(cat "$sysroot/.ucp-sysroot")" = "$stamp" ]; then
    echo "cached: $sysroot ($(du -sh "$sysroot" | cut -f1))"
    return 0
  fi
  tmp="$sysroot.partial"
  rm -rf "$tmp"
  # Downloads the packages with their dependencies (debootstrap resolves them) and only unpacks them: nothing
  # of arm64 is configured or run, and the host's dpkg database is not involved.
  debootstrap --arch=arm64 --variant=minbase --download-only --include="$pkgs" "$suite" "$tmp" "$mirror"
  local n=0 deb
  for deb in "$tmp"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$tmp"; n=$((n + 1)); done
  # Not needed to build or run: the downloaded packages, documentation, and the arm64 compilers that came with
  # libopenmpi-dev's dependency on gfortran (the cross compiler is the host's).
  rm -rf "$tmp"/var/cache/apt/archives "$tmp"/usr/share/doc "$tmp"/usr/share/man "$tmp"/usr/share/locale "$tmp"/usr/share/info
  rm -f "$tmp"/usr/lib/gcc/aarch64-linux-gnu/*/{cc1,cc1plus,f951,lto1,lto-wrapper,collect2}
  # Absolute symbolic links (libz.so -> /lib/aarch64-linux-gnu/libz.so.1...) would point into the host: made
  # relative, inside the sysroot.
  local link target
  while IFS= read -r -d '' link; do
    target="$(readlink "$link")"
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$tmp$target")" "$link"
  done < <(find "$tmp" -xdev -type l -lname '/*' -print0)
  for p in usr/lib/aarch64-linux-gnu/openmpi/lib/libmpi.so usr/lib/aarch64-linux-gnu/hdf5/openmpi/lib/libhdf5.so \
           usr/include/hdf5/openmpi/hdf5.h usr/lib/aarch64-linux-gnu/libdeflate.so usr/include/xxhash.h \
           usr/include/CLI/CLI.hpp usr/include/nlohmann/json.hpp usr/include/catch2/catch.hpp lib/ld-linux-aarch64.so.1; do
    [ -e "$tmp/$p" ] || { echo "sysroot: $p is missing after unpacking $n packages"; return 1; }
  done
  echo "$stamp" > "$tmp/.ucp-sysroot"
  rm -rf "$sysroot"
  mv "$tmp" "$sysroot"
  echo "built: $sysroot from $n packages ($(du -sh "$sysroot" | cut -f1))"
}

# ---- binfmt ---------------------------------------------------------------------------------------------
binfmt_name=ucp-qemu-aarch64
arm64_runs_directly() { "$arm/apps/ucp-inspect" --version > /dev/null 2>&1 || "$cache/hello-arm64" > /dev/null 2>&1; }
register_binfmt() {
  printf 'int main(void) { return 0; }\n' | aarch64-linux-gnu-gcc --sysroot="$sysroot" -x c -o "$cache/hello-arm64" -
  if "$cache/hello-arm64" 2> /dev/null; then
    echo "arm64 executables already run directly ($(ls /proc/sys/fs/binfmt_misc | grep -i aarch64 | head -n 1))"
    return 0
  fi
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2> /dev/null || {
    echo "binfmt_misc cannot be mounted here: the 2-rank runs are skipped"; return 3; }
  # qemu's own registration for aarch64 ELF executables (magic and mask of its qemu-binfmt-conf.sh); F: the
  # interpreter is opened now. QEMU_LD_PREFIX (exported above) gives it the sysroot.
  local magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
  local mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
  [ -e "/proc/sys/fs/binfmt_misc/$binfmt_name" ] ||
    printf ':%s:M::%s:%s:%s:F' "$binfmt_name" "$magic" "$mask" "$(command -v qemu-aarch64)" \
      > /proc/sys/fs/binfmt_misc/register 2> /dev/null || {
    echo "binfmt_misc does not take a registration here: the 2-rank runs are skipped"; return 3; }
  "$cache/hello-arm64" || { echo "registered $binfmt_name, yet an arm64 executable does not run"; return 1; }
  echo "registered $binfmt_name: arm64 executables run under qemu-aarch64"
}

# ---- builds ---------------------------------------------------------------------------------------------
build_x86() {
  BUILD_DIR="$x86" nice -n 10 bash "$root/scripts/build.sh" "${cmake_args[@]}"
  echo "built $x86"
}
build_arm64() {
  UCP_AARCH64_SYSROOT="$sysroot" cmake -S "$root" -B "$arm" -DCMAKE_TOOLCHAIN_FILE="$root/scripts/aarch64-linux-gnu.cmake" \
    -DUCP_AARCH64_SYSROOT="$sysroot" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" "${cmake_args[@]}"
  nice -n 10 cmake --build "$arm" -j "$(nproc)"
  file -L "$arm/apps/ucp-convert" | grep -q "ARM aarch64" || { echo "$arm/apps/ucp-convert is not an arm64 executable"; return 1; }
  qemu-aarch64 "$arm/apps/ucp-convert" --version | head -n 1
  echo "built $arm (arm64)"
}

# ---- unit tests -----------------------------------------------------------------------------------------
# The x86 build's ctest steps that write the unit tests' inputs: the torch-written reader cases and rounding
# cases, the fixture checkpoints (each step also pulls in what it requires), and the atomic checkpoints the
# reshard-plan tests read. What they write is files: the arm64 tests read them.
fixtures() {
  local steps="^(reader_cases_generate|rounding_like_torch_generate|fixture_.*|convert_(tp2_pp2_dp2_bf16|gptq_tp2_pp2_dp2|zero3_tp2_dp2_gpt)_np2)\$"
  [ "${UCP_AARCH64_LARGE:-0}" = 1 ] && steps="${steps%)\$}|large_case_generate)\$"
  nice -n 10 ctest --test-dir "$x86" -R "$steps" -j "$(nproc)" --output-on-failure
}

unit_arm64() {
  local work="$cache/unit-work" x86_work="$x86/tests/work"
  rm -rf "$work"
  mkdir -p "$work"
  # The generated inputs, shared with the x86 build; everything the tests write goes to the arm64 folder.
  for d in fixtures reader_cases rounding atomic large; do
    [ -e "$x86_work/$d" ] && ln -s "$x86_work/$d" "$work/$d"
  done
  # Every ctest test that runs ucp_unit_tests, with its arguments and environment, from the x86 build's ctest.
  "$py" - "$x86" > "$work/tests.tsv" << 'EOF'
import json, subprocess, sys
j = json.loads(subprocess.run(["ctest", "--test-dir", sys.argv[1], "--show-only=json-v1"], check=True,
                              capture_output=True, text=True).stdout)
for t in j["tests"]:
    cmd = t.get("command") or []
    if not cmd or not cmd[0].endswith("/ucp_unit_tests"):
        continue
    env = next((p["value"] for p in t.get("properties", []) if p["name"] == "ENVIRONMENT"), [])
    print("\t".join([t["name"], "\x1f".join(cmd[1:]), "\x1f".join(env)]))
EOF
  local name args env failed=0 ran=0 checks=0 skipped=()
  while IFS=$'\t' read -r name args env; do
    if [ "$name" = reader_zip64_over_4gib ] && [ "${UCP_AARCH64_LARGE:-0}" != 1 ]; then
      skipped+=("$name (a 4 GiB torch.save fixture; UCP_AARCH64_LARGE=1 runs it)")
      continue
    fi
    local -a a=() e=()
    [ -n "$args" ] && IFS=$'\x1f' read -r -a a <<< "$args"
    [ -n "$env" ] && IFS=$'\x1f' read -r -a e <<< "$env"
    # UCP_TEST_WORK points at the arm64 work folder; other variables (UCP_REAL_DEEPSPEED) as ctest sets them.
    local -a vars=()
    local v
    for v in "${e[@]}"; do
      case "$v" in UCP_TEST_WORK=*) vars+=("UCP_TEST_WORK=$work") ;; *) vars+=("$v") ;; esac
    done
    local start took status
    start=$(date +%s.%N)
    set +e
    (cd "$work" && env "${vars[@]}" UCP_TEST_WORK="$work" qemu-aarch64 "$arm/tests/ucp_unit_tests" "${a[@]}") > "$work/$name.log" 2>&1
    status=$?
    set -e
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    ran=$((ran + 1))
    if [ $status -eq 0 ]; then
      echo "unit $name: PASS in ${took}s ($(grep -E '^All tests passed|test cases' "$work/$name.log" | tail -n 1))"
    else
      failed=$((failed + 1))
      echo "unit $name: FAIL in ${took}s (exit $status):"
      tail -n 40 "$work/$name.log" | sed 's/^/    /'
    fi
  done < "$work/tests.tsv"
  # The files the arm64 writer tests wrote, loaded by Python's torch.load (ctest's writer_cases_torch_load).
  if [ -d "$work/written" ]; then
    checks=1
    if "$py" "$root/tests/python/check_written.py" "$work/written" > "$work/check_written.log" 2>&1; then
      echo "torch.load of the arm64-written files: PASS ($(tail -n 1 "$work/check_written.log"))"
    else
      failed=$((failed + 1))
      echo "torch.load of the arm64-written files: FAIL"
      tail -n 20 "$work/check_written.log" | sed 's/^/    /'
    fi
  fi
  local s
  for s in "${skipped[@]}"; do echo "not run: $s"; done
  echo "$((ran + checks - failed)) passed, $failed failed ($ran unit tests under qemu, $checks torch.load check)${skipped:+; ${#skipped[@]} not run}"
  [ $failed -eq 0 ]
}

# ---- the sample checkpoint through both builds ----------------------------------------------------------
sample="$root/tests/data/sample_llama_tp2_pp2_dp2_bf16"
cmp_work="$cache/sample"
# run_both STEP RANKS APP ARGS...: runs APP of each build in the same folder ($cmp_work/run, so that paths
# recorded in files are the same bytes), then moves what it wrote to $cmp_work/{x86,arm64}/STEP. Arguments
# may name @OUT (the step's output) and @IN:STEP (an earlier step's output of the same build).
run_both() {
  local step=$1 ranks=$2 app=$3 build tool
  shift 3
  for build in x86 arm64; do
    local dir="$x86"
    [ "$build" = arm64 ] && dir="$arm"
    rm -rf "$cmp_work/run" "$cmp_work/$build/$step"
    mkdir -p "$cmp_work/run" "$cmp_work/$build"
    local -a args=()
    local a
    for a in "$@"; do
      case "$a" in
        @OUT) args+=("$cmp_work/run/out") ;;
        @IN:*) rm -rf "$cmp_work/run/in"; cp -a "$cmp_work/$build/${a#@IN:}/out" "$cmp_work/run/in"; args+=("$cmp_work/run/in") ;;
        *) args+=("$a") ;;
      esac
    done
    local -a cmd=("$dir/apps/$app" "${args[@]}")
    if [ "$build" = arm64 ] && [ "$ranks" = 1 ]; then
      cmd=(qemu-aarch64 "${cmd[@]}")
    fi
    if [ "$ranks" -gt 1 ]; then
      if [ "$build" = arm64 ]; then
        # The arm64 Open MPI's own mpirun (under qemu through binfmt_misc), so that daemons and ranks agree.
        # qemu-user has no process_vm_readv (ENOSYS), which Open MPI's shared-memory transport tries for
        # large messages: told to copy through its buffers instead (an emulation matter, not an arm64 one).
        cmd=(env OMPI_MCA_btl_vader_single_copy_mechanism=none
             "$sysroot/usr/bin/mpirun.openmpi" --oversubscribe -np "$ranks" "${cmd[@]}")
      else
        cmd=(mpirun --oversubscribe -np "$ranks" "${cmd[@]}")
      fi
    fi
    local status=0
    (cd "$cmp_work/run" && "${cmd[@]}") > "$cmp_work/run/stdout" 2> "$cmp_work/run/stderr" || status=$?
    echo "$status" > "$cmp_work/run/exit"
    mv "$cmp_work/run" "$cmp_work/$build/$step"
    if [ "$status" -ne 0 ]; then
      echo "$build $step: $app exited $status:"
      tail -n 20 "$cmp_work/$build/$step/stderr" | sed 's/^/    /'
      return 1
    fi
  done
  compare_step "$step"
}

# compare_step STEP: every file the two builds wrote, byte for byte; ucp_manifest.json as JSON without
# "created" (the time of the run) and "ucp_commit" (the commit each build was made at: the same when both
# come from one checkout); stdout and stderr with the seconds, peak RSS and creation times masked.
compare_step() {
  "$py" - "$cmp_work/x86/$1" "$cmp_work/arm64/$1" << 'EOF'
import json, os, re, sys
a, b = sys.argv[1:3]
def files(top):
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)
fa, fb = files(a), files(b)
if fa != fb:
    sys.exit(f"different files: only x86 {sorted(set(fa) - set(fb))}, only arm64 {sorted(set(fb) - set(fa))}")
masks = [(re.compile(r"\bin \d+(\.\d+)?s\b"), "in <s>s"), (re.compile(r"peak RSS \d+(\.\d+)? \w+"), "peak RSS <rss>"),
         (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"), "<created>")]
compared = tensors = 0
for rel in fa:
    x, y = open(os.path.join(a, rel), "rb").read(), open(os.path.join(b, rel), "rb").read()
    name = os.path.basename(rel)
    if name == "ucp_manifest.json":
        jx, jy = json.loads(x), json.loads(y)
        varying = [k for k in ("created", "ucp_commit") if jx.get(k) != jy.get(k)]
        if varying:
            print(f"{rel}: {', '.join(f'{k} {jx.get(k)!r} / {jy.get(k)!r}' for k in varying)} (not compared)")
        for j in (jx, jy):
            for k in ("created", "ucp_commit"):
                j.pop(k, None)
        same = jx == jy
    elif name in ("stdout", "stderr"):
        mx, my = x.decode(errors="replace"), y.decode(errors="replace")
        for p, label in masks:
            mx, my = p.sub(label, mx), p.sub(label, my)
        same = mx == my
    else:
        same = x == y
    if not same:
        sys.exit(f"{rel}: x86-64 and arm64 outputs differ")
    compared += 1
    tensors += rel.endswith((".pt", ".h5", ".safetensors"))
print(f"{os.path.basename(a)}: {compared} files the same ({tensors} tensor files byte for byte)")
EOF
}

sample_convert_np1() {
  run_both convert-np1 1 ucp-convert "$sample" -o @OUT
  run_both convert-np1-hdf5 1 ucp-convert "$sample" -o @OUT --format hdf5
}
sample_convert_np2() {
  arm64_runs_directly || { echo "arm64 executables do not run directly (no binfmt_misc): 2-rank runs skipped"; return 3; }
  run_both convert-np2 2 ucp-convert "$sample" -o @OUT
}
sample_inspect() {
  run_both inspect-verify 1 ucp-inspect @IN:convert-np1 --verify
  run_both inspect-verify-hdf5 1 ucp-inspect @IN:convert-np1-hdf5 --verify
}
sample_reshard() {
  run_both reshard-np1 1 ucp-reshard @IN:convert-np1 -o @OUT --dp 2 --tp 1 --pp 1 --zero-stage 1
  if arm64_runs_directly; then
    run_both reshard-np2 2 ucp-reshard @IN:convert-np1 -o @OUT --dp 2 --tp 1 --pp 1 --zero-stage 1
  else
    echo "arm64 executables do not run directly (no binfmt_misc): the 2-rank reshard skipped"
  fi
  run_both inspect-reshard 1 ucp-inspect @IN:reshard-np1
}

compare_builds() {
  [ "$compare" = none ] && { echo "UCP_AARCH64_COMPARE=none"; return 3; }
  arm64_runs_directly || { echo "arm64 executables do not run directly (no binfmt_misc)"; return 3; }
  local -a flags=(--jobs 1)
  [ "$compare" = quick ] && flags+=(--quick)
  # It starts both builds' 2-rank runs with the host's mpirun: arm64 ranks (through binfmt_misc) under x86-64
  # Open MPI daemons, which speak the same PMIx; the sample phases above use the arm64 mpirun itself.
  rm -rf "$cache/compare"
  OMPI_MCA_btl_vader_single_copy_mechanism=none "$py" "$root/scripts/compare_builds.py" --baseline "$x86" --build "$arm" --work "$cache/compare" "${flags[@]}"
}

# ---- run ------------------------------------------------------------------------------------------------
echo "ucp on aarch64: sysroot $sysroot, x86 build $x86, arm64 build $arm"
# run NAME FUNCTION [NEEDED...]: the phase, when it is wanted (UCP_AARCH64_PHASES) and the phases it needs passed.
run() {
  local name=$1 fn=$2 need
  shift 2
  wanted "$name" || return 0
  for need in "$@"; do
    passed "$need" || { record "$name" FAIL 0 "not run: $need did not pass"; return 0; }
  done
  phase "$name" "$fn"
}
run host-packages host_packages
run sysroot build_sysroot host-packages
run binfmt register_binfmt sysroot
run build-x86 build_x86 host-packages
run build-arm64 build_arm64 sysroot
run fixtures fixtures build-x86
run unit-arm64 unit_arm64 build-arm64 fixtures
wanted sample-convert-np1 && rm -rf "$cmp_work"
run sample-convert-np1 sample_convert_np1 build-x86 build-arm64
run sample-convert-np2 sample_convert_np2 build-x86 build-arm64
run sample-inspect-verify sample_inspect sample-convert-np1
run sample-reshard sample_reshard sample-convert-np1
run compare-builds compare_builds build-x86 build-arm64

echo
echo "ucp on aarch64 (arm64 under $(qemu-aarch64 --version 2> /dev/null | head -n 1)): summary"
fail=0 total=0
for i in "${!names[@]}"; do
  printf '  %-22s %-4s %8ss  %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}" "${notes[$i]}"
  total=$(awk -v a="$total" -v b="${seconds[$i]}" 'BEGIN { printf "%.1f", a + b }')
  [ "${results[$i]}" = FAIL ] && fail=1
done
echo "  total ${total}s; sysroot $(du -sh "$sysroot" 2> /dev/null | cut -f1), logs in $log_dir"
if [ $fail -ne 0 ]; then
  echo "FAIL"
  exit 1
fi
echo "PASS"
