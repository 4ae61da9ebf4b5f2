#!/usr/bin/env bash
# The Debian package, installed where nothing else of ucp is: builds ucp_<version>_<arch>.deb with
# `cpack -G DEB`, installs it with apt into a clean Debian bookworm chroot (debootstrap, minbase), runs the
# installed tools there on the bundled sample, and compares what they wrote with what the build tree's own
# binaries write from the same sample outside. Then the modulefiles of packaging/modules: Lmod and
# Environment Modules, each in that chroot, over a `cmake --install` prefix.
#
#     bash scripts/deb_check.sh [BUILD_DIR]        (as root; default BUILD_DIR: build/)
#
# Run by hand before a release; it is not part of CI (CI's time is spent). It needs root, debootstrap and
# the Debian mirror. About 2 minutes on 2 busy cores once the chroot is cached; the first run adds
# debootstrap (a few minutes) and apt's downloads (about 40 MB).
# - BUILD_DIR is configured as scripts/build.sh does when it has no CMakeCache.txt, and built either way.
# - The chroot is cached in UCP_DEB_CHROOT (default /work/cache/pkg/bookworm): pristine/ is debootstrap's
#   output, made once; every run copies it afresh to root/ (left after the run, to look into), so nothing
#   a previous run installed can stand in for a dependency the package fails to declare. archives/ keeps
#   apt's downloaded .debs between runs (it only saves downloads: apt still resolves every dependency);
#   work/ holds the build tree's own run; log/ each check's output. UCP_DEB_MIRROR overrides
#   debootstrap's default mirror.
# - In the chroot only the .deb and a copy of the sample are put; apt installs the package without
#   Recommends, so its Depends alone must be enough.
# Prints PASS or FAIL per check, a summary and the wall time; exits 1 on any failure.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(realpath -m "${1:-$root/build}")"
cache="$(realpath -m "${UCP_DEB_CHROOT:-/work/cache/pkg/bookworm}")"
suite=bookworm
rootfs="$cache/root"
work="$cache/work"  # outside the chroot: the build tree's own run, cmake --install's file list
sample_src="$root/tests/data/sample_llama_tp2_pp2_dp2_bf16"
start=$SECONDS
passed=0
failed=0
status=FAIL

say() { printf '%s\n' "$*"; }
pass() { passed=$((passed + 1)); say "PASS  $*"; }
fail() { failed=$((failed + 1)); say "FAIL  $*"; }
die() { say "deb_check: $*" >&2; exit 1; }

# Runs a command in the chroot with a clean environment: nothing of this shell's (PATH, UCP_DATA_DIR,
# LD_LIBRARY_PATH) leaks in.
in_chroot() {
  chroot "$rootfs" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root LANG=C.UTF-8 \
    TERM=dumb DEBIAN_FRONTEND=noninteractive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$@"
}

mounts=()
mount_in() {  # mount_in TARGET MOUNT-ARGS...: mounted now, unmounted on every exit
  mkdir -p "$1"
  mount "${@:2}" "$1"
  mounts+=("$1")
}
unmount_all() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" || say "deb_check: cannot unmount ${mounts[i]}" >&2
  done
  mounts=()
}
finish() {
  local rc=$?
  unmount_all
  [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && status=PASS
  say ""
  say "deb_check: $status: $passed passed, $failed failed; wall time $((SECONDS - start)) s${deb:+; $(basename "$deb")}"
  [ "$status" = PASS ] || exit 1
}
trap finish EXIT

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mount)"
for tool in debootstrap dpkg-deb cpack cmake mpirun /usr/bin/python3; do
  command -v "$tool" > /dev/null || die "needs $tool (apt-get install debootstrap dpkg-dev cmake openmpi-bin python3)"
done
[ -d "$sample_src" ] || die "$sample_src: the bundled sample is missing"

# --- (a) The package, from the build folder --------------------------------------------------------------
say "== building the package in $build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  BUILD_DIR="$build" bash "$root/scripts/build.sh"
else
  cmake --build "$build" -j "$(nproc)" > /dev/null
fi
rm -f "$build"/ucp_*.deb
(cd "$build" && cpack -G DEB > "$build/cpack.log" 2>&1) || { cat "$build/cpack.log"; die "cpack -G DEB failed"; }
debs=("$build"/ucp_*.deb)
[ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || die "cpack wrote no single ucp_*.deb in $build: ${debs[*]}"
deb="${debs[0]}"
version="$(dpkg-deb -f "$deb" Version)"
depends="$(dpkg-deb -f "$deb" Depends)"
say "   $(basename "$deb"): $(du -k "$deb" | cut -f1) KiB; Installed-Size: $(dpkg-deb -f "$deb" Installed-Size) KiB"
say "   Architecture: $(dpkg-deb -f "$deb" Architecture)"
say "   Depends: $depends"

[ "$(dpkg-deb -f "$deb" Package)" = ucp ] && [ "$(dpkg-deb -f "$deb" Architecture)" = "$(dpkg --print-architecture)" ] \
  && pass "package ucp, architecture $(dpkg --print-architecture) (dpkg's)" \
  || fail "package name or architecture: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Architecture)"
project_version="$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")"
[ -n "$project_version" ] && [ "$version" = "$project_version" ] && pass "version $version, project()'s" \
  || fail "package version '$version', project() says '$project_version'"
# dpkg-shlibdeps ran (it names the library packages), and mpirun's package is there.
depends_names="$(tr ',' '\n' <<< "$depends" | sed 's/^ *//; s/[ (].*//')"
for want in openmpi-bin libopenmpi3 'libhdf5-openmpi-[0-9].*' libdeflate0 libxxhash0 zlib1g 'libstdc\+\+6' libc6; do
  grep -Eqx "$want" <<< "$depends_names" && pass "Depends names ${want//\\/}" || fail "Depends lacks ${want//\\/}: $depends"
done

# What the package holds is what `cmake --install` lays out, and that is bin/ucp-*, share/ucp and share/man.
rm -rf --one-file-system "$work" "$cache/log" && mkdir -p "$work/install" "$cache/log"
cmake --install "$build" --prefix "$work/install/usr" > /dev/null
(cd "$work/install" && find . -type f | sort) > "$work/install.list"
dpkg-deb -c "$deb" | awk '$1 !~ /^d/ {print $6}' | sort > "$work/deb.list"
if diff -u "$work/install.list" "$work/deb.list" > "$work/list.diff"; then
  pass "the package's files are cmake --install's ($(wc -l < "$work/deb.list") files)"
else
  fail "the package's files differ from cmake --install's:"; cat "$work/list.diff"
fi
stray="$(grep -Ev '^\./usr/(bin/ucp-(convert|inspect|reshard)|share/ucp/(patterns|schemas)/[^/]+\.json|share/man/man[1-9]/[^/]+)$' "$work/deb.list" || true)"
[ -z "$stray" ] && pass "only bin/ucp-*, share/ucp and share/man (no tests)" || fail "files outside bin/ucp-*, share/ucp, share/man: $stray"
has_man=no
grep -Eq '^\./usr/share/man/man1/ucp-convert\.1(\.gz)?$' "$work/deb.list" && has_man=yes

# --- (b) A clean bookworm chroot -------------------------------------------------------------------------
if [ ! -d "$cache/pristine" ]; then
  say "== debootstrap --variant=minbase $suite into $cache/pristine (once; a few minutes)"
  rm -rf --one-file-system "$cache/pristine.partial"
  mkdir -p "$cache"
  debootstrap --variant=minbase "$suite" "$cache/pristine.partial" ${UCP_DEB_MIRROR:+"$UCP_DEB_MIRROR"} \
    > "$cache/debootstrap.log" 2>&1 || { tail -n 20 "$cache/debootstrap.log"; die "debootstrap failed (log: $cache/debootstrap.log)"; }
  mv "$cache/pristine.partial" "$cache/pristine"
fi
# A previous run that was killed may have left mounts under root/: never delete through them.
while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done < <(findmnt -rn -o TARGET | grep -F "$rootfs/" | sort -r || true)
if findmnt -rn -o TARGET | grep -qF "$rootfs/"; then die "$rootfs: still has mounts; unmount them first"; fi
say "== a fresh copy of the pristine chroot: $rootfs"
rm -rf --one-file-system "$rootfs"
cp -a "$cache/pristine" "$rootfs"
cp -L /etc/resolv.conf "$rootfs/etc/resolv.conf"
mkdir -p "$cache/archives/partial"
mount_in "$rootfs/proc" -t proc proc
mount_in "$rootfs/sys" -t sysfs -o ro sysfs  # hwloc (Open MPI) reads the machine's topology there
# debootstrap made /dev's nodes; /dev/shm, Open MPI's shared-memory transport, is a tmpfs of its own.
mount_in "$rootfs/dev/shm" -t tmpfs -o size=1g tmpfs
mount_in "$rootfs/var/cache/apt/archives" --bind "$cache/archives"

# --- (c) apt installs the .deb, resolving its Depends from the mirror ------------------------------------
cp "$deb" "$rootfs/tmp/"
say "== apt-get install ./$(basename "$deb") (no Recommends)"
if in_chroot apt-get -q update > "$cache/apt.log" 2>&1 \
   && in_chroot sh -c "cd /tmp && apt-get install -y -q --no-install-recommends ./$(basename "$deb")" >> "$cache/apt.log" 2>&1; then
  pass "apt-get install ./$(basename "$deb"): $(in_chroot dpkg-query -W -f '${Status}' ucp)"
else
  tail -n 30 "$cache/apt.log"; fail "apt-get install (log: $cache/apt.log)"; exit 1
fi
say "   apt installed $(grep -c '^Setting up ' "$cache/apt.log") packages (log: $cache/apt.log)"

# --- (d) The installed tools, with nothing of the source or build tree in sight --------------------------
for p in "$root" "$build"; do
  in_chroot test ! -e "$p" || fail "$p is visible in the chroot"
done
rm -rf --one-file-system "$rootfs/sample" "$rootfs/out"
cp -a "$sample_src" "$rootfs/sample"
mkdir -p "$rootfs/out"
log_of() { printf '%s/log/%s.txt' "$cache" "$(printf '%s' "$1" | tr -c 'A-Za-z0-9.-' '_')"; }
check() {  # check NAME COMMAND...: runs it in the chroot; its output goes to $(log_of NAME)
  local name="$1" log; shift
  log="$(log_of "$name")"
  if in_chroot "$@" > "$log" 2>&1; then pass "$name"; else
    fail "$name (exit $?; log $log):"; tail -n 20 "$log"; fi
}
for tool in ucp-convert ucp-inspect ucp-reshard; do
  check "$tool --version" sh -c "$tool --version && test \"\$(command -v $tool)\" = /usr/bin/$tool"
  log="$(log_of "$tool --version")"
  grep -q "^$tool $version " "$log" && tail -n 1 "$log" | grep -qx 'patterns /usr/share/ucp/patterns' \
    && pass "$tool --version: version $version, patterns /usr/share/ucp/patterns" \
    || fail "$tool --version says: $(cat "$log")"
done
say "   $(head -n 1 "$(log_of "ucp-convert --version")")"
check "mpirun -np 2 ucp-convert /sample -o /out/atomic" mpirun -np 2 --oversubscribe ucp-convert /sample -o /out/atomic
check "ucp-inspect --verify /out/atomic" ucp-inspect /out/atomic --verify
check "mpirun -np 2 ucp-reshard /out/atomic -o /out/tp1 (DP 2, TP 1, PP 1, ZeRO 1)" \
  mpirun -np 2 --oversubscribe ucp-reshard /out/atomic -o /out/tp1 --dp 2 --tp 1 --pp 1 --zero-stage 1
check "ucp-inspect /out/tp1" ucp-inspect /out/tp1
grep -Eq '^layout +dp=2 tp=1 pp=1 +ZeRO-1 ' "$(log_of "ucp-inspect /out/tp1")" \
  && pass "ucp-inspect /out/tp1: layout dp=2 tp=1 pp=1 ZeRO-1" || fail "ucp-inspect /out/tp1 shows another layout (log $(log_of "ucp-inspect /out/tp1"))"

# --- (e) The same sample through the build tree's own binaries, outside: the same atomic checkpoint -------
say "== the build tree's ucp-convert on the same sample, outside the chroot"
rm -rf --one-file-system "$work/host" && mkdir -p "$work/host"
cp -a "$sample_src" "$work/host/sample"
if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe \
     "$build/apps/ucp-convert" "$work/host/sample" -o "$work/host/atomic" > "$work/host/convert.txt" 2>&1; then
  pass "build tree: mpirun -np 2 ucp-convert (outside)"
else
  fail "build tree's ucp-convert:"; tail -n 20 "$work/host/convert.txt"
fi
host_patterns="$("$build/apps/ucp-inspect" --version | sed -n 's/^patterns //p')"
# The manifest records the source folder and the pattern file read: the places that differ by design.
if /usr/bin/python3 "$root/scripts/compare_atomic.py" "$rootfs/out/atomic" "$work/host/atomic" \
     --same "/sample=$work/host/sample" --same "/usr/share/ucp/patterns=$host_patterns" > "$work/compare.txt" 2>&1; then
  pass "the chroot's atomic checkpoint is the build tree's: $(tail -n 1 "$work/compare.txt")"
else
  fail "the chroot's atomic checkpoint differs from the build tree's:"
fi
sed 's/^/   /' "$work/compare.txt"
if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe "$build/apps/ucp-reshard" \
     "$work/host/atomic" -o "$work/host/tp1" --dp 2 --tp 1 --pp 1 --zero-stage 1 > "$work/host/reshard.txt" 2>&1 \
   && /usr/bin/python3 "$root/scripts/compare_atomic.py" "$rootfs/out/tp1" "$work/host/tp1" > "$work/compare_tp1.txt" 2>&1; then
  pass "the chroot's resharded checkpoint is the build tree's: $(tail -n 1 "$work/compare_tp1.txt")"
else
  fail "the build tree's ucp-reshard failed, or its output differs from the chroot's:"
  tail -n 20 "$work/host/reshard.txt" "$work/compare_tp1.txt"
fi

# --- man pages, then the modulefiles (test tools installed only now, after the package's own checks) -----
if [ "$has_man" = yes ]; then
  in_chroot apt-get install -y -q --no-install-recommends man-db >> "$cache/apt.log" 2>&1 || fail "apt-get install man-db"
  check "man -w ucp-convert" man -w ucp-convert
  log="$(log_of "man -w ucp-convert")"
  grep -Eq '^/usr/share/man/man1/ucp-convert\.1(\.gz)?$' "$log" && pass "man -w ucp-convert: $(cat "$log")" \
    || fail "man -w ucp-convert: $(cat "$log")"
else
  say "NOTE  the package has no man pages (no share/man/man1/ucp-convert.1): man -w not run"
fi

say "== the modulefiles (packaging/modules), over a cmake --install prefix in the chroot"
# The package goes (its libraries stay), so that only a module can put ucp-convert on PATH.
in_chroot dpkg --purge ucp >> "$cache/apt.log" 2>&1 && in_chroot sh -c '! command -v ucp-convert && test ! -e /usr/share/ucp' \
  && pass "dpkg --purge ucp: no ucp-convert on PATH, no /usr/share/ucp left" || fail "dpkg --purge ucp left files or failed"
# Each modulefile is copied twice, its root line changed: to where the prefix is installed (so that the one
# line is shown to be enough) and, as version 9.9.9, to a folder that does not exist (a clear refusal).
modroot=/srv/sw/ucp
cmake --install "$build" --prefix "$rootfs$modroot/$version" > /dev/null
for kind in lmod tcl; do
  ext=""; [ $kind = lmod ] && ext=.lua
  src="$root/packaging/modules/$kind/ucp/$version$ext"
  [ -f "$src" ] || { fail "$src: no modulefile for version $version (rename the one in packaging/modules/$kind/ucp/)"; continue; }
  if [ $kind = lmod ]; then pattern='^local root = "/opt/ucp"$'; line='local root = "%s"'
  else pattern='^set root /opt/ucp$'; line='set root %s'; fi
  [ "$(grep -c "$pattern" "$src")" -eq 1 ] || { fail "$src: no single root line matching $pattern"; continue; }
  mkdir -p "$rootfs/modulefiles-$kind/ucp"
  # shellcheck disable=SC2059  # the line is the format
  sed "s|$pattern|$(printf "$line" "$modroot")|" "$src" > "$rootfs/modulefiles-$kind/ucp/$version$ext"
  # shellcheck disable=SC2059
  sed "s|$pattern|$(printf "$line" /nonexistent)|" "$src" > "$rootfs/modulefiles-$kind/ucp/9.9.9$ext"
done
module_check() {  # module_check PACKAGE INIT-SCRIPT MODULEPATH
  local pkg="$1" init="$2" modpath="$3"
  if ! in_chroot apt-get install -y -q --no-install-recommends "$pkg" man-db >> "$cache/apt.log" 2>&1; then
    fail "apt-get install $pkg (log: $cache/apt.log)"; return
  fi
  # MANPATH unset before, as on a fresh login: the system's man pages must still be found after the load.
  check "$pkg: module load ucp/$version: PATH, MANPATH, ucp-convert --version; module unload" bash -c "
    set -e
    unset MANPATH
    . $init
    module use $modpath
    ! command -v ucp-convert
    module load ucp/$version
    echo \"PATH=\$PATH\"; echo \"MANPATH=\${MANPATH-}\"
    test \"\$(command -v ucp-convert)\" = $modroot/$version/bin/ucp-convert
    ucp-convert --version
    ucp-convert --version | tail -n 1 | grep -qx 'patterns $modroot/$version/share/ucp/patterns'
    case \":\$MANPATH:\" in *:$modroot/$version/share/man:*) ;; *) echo 'MANPATH lacks the prefix'; exit 1;; esac
    man -w ls
    module unload ucp
    ! command -v ucp-convert
    echo unloaded"
  check "$pkg: module load ucp/9.9.9 (root missing) fails, PATH unchanged" bash -c "
    . $init
    module use $modpath
    if module load ucp/9.9.9; then echo 'loaded'; exit 1; fi
    ! command -v ucp-convert"
  grep -q '/nonexistent/9.9.9/bin' "$(log_of "$pkg: module load ucp/9.9.9 (root missing) fails, PATH unchanged")" \
    && pass "$pkg: the refusal names the missing folder" || fail "$pkg: the refusal does not name /nonexistent/9.9.9/bin"
  in_chroot apt-get purge -y -q "$pkg" >> "$cache/apt.log" 2>&1 || fail "apt-get purge $pkg"
}
# Lmod and Environment Modules conflict in Debian: one after the other.
module_check lmod /usr/share/lmod/lmod/init/bash /modulefiles-lmod
module_check environment-modules /usr/share/modules/init/bash /modulefiles-tcl
