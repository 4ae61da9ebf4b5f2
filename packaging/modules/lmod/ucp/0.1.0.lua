-- Lmod modulefile for ucp installed into a prefix:  cmake --install build --prefix <root>/<version>
-- Put it at <a MODULEPATH folder>/ucp/<version>.lua: the version is read from this file's name, so a copy
-- renamed for the next release serves it unchanged. The tools find their pattern files beside themselves
-- (<prefix>/share/ucp), so UCP_DATA_DIR is not set. Tested by scripts/deb_check.sh (packaging/README.md).

-- Where the versions of ucp are installed, each in <root>/<version>: the one line a site changes.
local root = "/opt/ucp"

local version = myModuleVersion()
local prefix = pathJoin(root, version)

whatis("Name: ucp")
whatis("Version: " .. version)
whatis("Description: Universal Checkpointing: convert and reshard LLM training checkpoints")
help([[
ucp ]] .. version .. [[ (]] .. prefix .. [[): ucp-convert, ucp-inspect, ucp-reshard.
Run them with the mpirun of the Open MPI they were built with, e.g.
  mpirun -np 4 ucp-convert CHECKPOINT -o ATOMIC
Each tool's --help lists its options; --version names the build and its pattern folder.]])

if mode() == "load" and not isDir(pathJoin(prefix, "bin")) then
  LmodError("ucp " .. version .. ": " .. pathJoin(prefix, "bin") .. " does not exist; install ucp there with\n" ..
            "  cmake --install BUILD --prefix " .. prefix .. "\nor change the root in " .. myFileName())
end

prepend_path("PATH", pathJoin(prefix, "bin"))
prepend_path("MANPATH", pathJoin(prefix, "share", "man"))
-- An empty entry: where MANPATH was unset, man still searches the system's man pages after the load.
append_path("MANPATH", "")
