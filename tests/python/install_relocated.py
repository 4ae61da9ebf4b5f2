"""ucp installed, then moved: `cmake --install BUILD --prefix P` lays out bin/ucp-*, share/ucp/patterns and
share/ucp/schemas; the prefix is then moved elsewhere (as a module tree or a package is), and the moved tools
must find their data beside themselves, never in the source or build tree.

    install_relocated.py BUILD_DIR SOURCE_DIR SAMPLE WORK

- every tool's --version: its name, ucp's version, the commit, the build type, Open MPI and HDF5, and the
  pattern folder it reads, which is the moved prefix's (UCP_DATA_DIR overrides it);
- share/ucp holds every pattern file and schema of the source tree, byte for byte;
- the moved ucp-convert converts the bundled sample, ucp-inspect verifies the result, and ucp-reshard
  writes a new layout from it; the manifest records the commit --version names;
- where the build found help2man (its CMakeCache), share/man/man1 holds each tool's page, the one the build
  made, naming every long option the installed tool's --help lists.
"""
import filecmp
import re
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish, fresh_folder  # noqa: E402

BUILD, SOURCE, SAMPLE, WORK = sys.argv[1:5]
fresh_folder(WORK)
prefix, moved = os.path.join(WORK, "prefix"), os.path.join(WORK, "moved", "ucp-0")
r = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], capture_output=True, text=True)
check("cmake --install into a prefix", r.returncode == 0, r.stdout[-800:] + r.stderr[-800:])
os.makedirs(os.path.dirname(moved))
os.rename(prefix, moved)
patterns = os.path.join(moved, "share", "ucp", "patterns")
for data in ("patterns", "schemas"):
    want = sorted(n for n in os.listdir(os.path.join(SOURCE, data)) if n.endswith(".json"))
    got = os.path.join(moved, "share", "ucp", data)
    check(f"share/ucp/{data}: every file of the source tree's, byte for byte ({len(want)})", os.path.isdir(got) and
          sorted(os.listdir(got)) == want and all(filecmp.cmp(os.path.join(SOURCE, data, n), os.path.join(got, n), shallow=False)
                                                 for n in want), str(sorted(os.listdir(got)) if os.path.isdir(got) else None))

commit = None
for tool in ("ucp-convert", "ucp-inspect", "ucp-reshard"):
    r = subprocess.run([os.path.join(moved, "bin", tool), "--version"], capture_output=True, text=True)
    first = r.stdout.splitlines()[0] if r.stdout else ""
    check(f"{tool} --version: name, version, commit, build type, Open MPI and HDF5", r.returncode == 0 and
          first.startswith(tool + " 0.") and "(commit " in first and " build; Open MPI " in first and ", HDF5 " in first, r.stdout + r.stderr)
    check(f"{tool} --version: the moved prefix's pattern files", r.stdout.splitlines()[-1:] == ["patterns " + patterns], r.stdout)
    commit = first.split("(commit ")[1].split(",")[0] if "(commit " in first else None
data = os.path.join(WORK, "data")
shutil.copytree(os.path.join(moved, "share", "ucp"), data)
r = subprocess.run([os.path.join(moved, "bin", "ucp-inspect"), "--version"], capture_output=True, text=True,
                   env=dict(os.environ, UCP_DATA_DIR=data))
check("UCP_DATA_DIR: the pattern files it names", r.stdout.splitlines()[-1:] == ["patterns " + os.path.join(data, "patterns")], r.stdout)

atomic, out = os.path.join(WORK, "atomic"), os.path.join(WORK, "out")
r = subprocess.run([os.path.join(moved, "bin", "ucp-convert"), SAMPLE, "-o", atomic], capture_output=True, text=True)
check("the moved ucp-convert converts the bundled sample", r.returncode == 0, r.stderr[-1000:])
r = subprocess.run([os.path.join(moved, "bin", "ucp-inspect"), atomic, "--verify"], capture_output=True, text=True)
check("the moved ucp-inspect verifies it", r.returncode == 0, r.stdout[-600:] + r.stderr[-600:])
if os.path.exists(os.path.join(atomic, "ucp_manifest.json")):
    manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
    check("the manifest records the build's commit", commit and manifest.get("ucp_commit") == commit, str(manifest.get("ucp_commit")))
r = subprocess.run([os.path.join(moved, "bin", "ucp-reshard"), atomic, "-o", out, "--dp", "1", "--tp", "1", "--pp", "1",
                    "--zero-stage", "1"], capture_output=True, text=True)
check("the moved ucp-reshard writes a new layout", r.returncode == 0 and os.path.exists(os.path.join(out, "latest")), r.stderr[-1000:])

cache = open(os.path.join(BUILD, "CMakeCache.txt")).read()
help2man = re.search(r"^UCP_HELP2MAN:FILEPATH=(.*)$", cache, re.M)
if help2man and not help2man.group(1).endswith("NOTFOUND"):
    for tool in ("ucp-convert", "ucp-inspect", "ucp-reshard"):
        page = os.path.join(moved, "share", "man", "man1", tool + ".1")
        built = os.path.join(BUILD, "docs", tool + ".1")
        check(f"share/man/man1/{tool}.1: installed, the page the build made", os.path.isfile(page) and os.path.isfile(built)
              and filecmp.cmp(page, built, shallow=False), page)
        if not os.path.isfile(page):
            continue
        text = open(page).read().replace("\\-", "-")
        r = subprocess.run([os.path.join(moved, "bin", tool), "--help"], capture_output=True, text=True)
        flags = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", r.stdout)))
        missing = [f for f in flags if f not in text]
        check(f"{tool}.1 names every long option of --help ({len(flags)})", r.returncode == 0 and flags and not missing, str(missing))
else:
    print("install_relocated: no help2man in this build (CMakeCache UCP_HELP2MAN): no man pages to check")
finish("install_relocated")
