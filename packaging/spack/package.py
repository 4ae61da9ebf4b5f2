# Spack recipe for ucp: `spack install ucp` builds the three tools with the site's MPI and a parallel HDF5.
#
# NOT TESTED: Spack is not packaged in Debian, and ucp is developed and tested on Debian bookworm only, so
# this recipe has never been run by Spack here. What was checked: it is valid Python (python3 -m
# py_compile), and every package named in a depends_on() exists under that name in Spack's builtin
# repository (spack-packages, 2026-07), with the variant used (hdf5 +mpi). The versions below are those
# ucp is built and tested with on Debian bookworm (CLI11 2.1.2, nlohmann-json 3.11.2, HDF5 1.10.8,
# libdeflate 1.14, xxHash 0.8.1, Catch2 2.13.10, zlib 1.2.13, CMake 3.25). See packaging/README.md.
# With UCP_BUILD_TESTS=OFF, configure needs no Python (the test suite's /usr/bin/python3 only with tests).
#
# To use it: put this file in a repository of your own as packages/ucp/package.py (`spack repo create`,
# then `spack repo add`), set `git` below to where your site clones ucp from (it has no public address
# yet), then `spack install ucp@main`. For a checkout on disk: `spack develop --path /path/to/ucp ucp@=main`
# in an environment, then `spack install`. A release is a tagged commit: add it as
# version("X.Y.Z", tag="vX.Y.Z", commit="<its 40 hex digits>").

from spack.package import *  # noqa: F401,F403

# Spack 1.x keeps the build systems in the builtin repository; Spack 0.x exported them from spack.package.
try:
    from spack_repo.builtin.build_systems.cmake import CMakePackage
except ImportError:
    pass


class Ucp(CMakePackage):
    """Universal Checkpointing: converts distributed LLM training checkpoints (DeepSpeed ZeRO with TP, PP,
    SP and EP; Megatron-LM and Megatron-Core torch_dist; PyTorch DCP; Hugging Face Trainer) into one atomic
    checkpoint of whole tensors in parallel HDF5, and writes it back at another parallel layout or as a
    Hugging Face model. MPI tools: ucp-convert, ucp-inspect, ucp-reshard."""

    # Where ucp is cloned from: your site's clone (a URL, or file:///path/to/ucp.git).
    git = "file:///srv/git/ucp.git"

    # No license() directive: ucp's repository does not state a license yet.

    version("main", branch="main")
    # 0.1.0 as project() names it at this commit (the first with --version and a relocatable install).
    version("0.1.0", commit="6e99dcb0c0aa0bcf1075f4e0f721e590713e28c8")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.22:", type="build")

    depends_on("mpi")
    depends_on("hdf5@1.10:+mpi")
    depends_on("cli11@2.1:")
    depends_on("nlohmann-json@3.10:")
    depends_on("zlib-api")
    depends_on("libdeflate@1.14:")
    depends_on("xxhash@0.8:")
    # The unit tests are Catch2 v2's (catch2/catch.hpp). The rest of the suite runs Debian's /usr/bin/python3
    # with torch, so `spack install --test=root ucp` only works where that python is.
    depends_on("catch2@2", type="test")

    # C++20: ucp is built and tested with GCC 12.
    conflicts("%gcc@:9", msg="ucp needs C++20 (tested with GCC 12)")

    def cmake_args(self):
        return [
            self.define("UCP_BUILD_TESTS", self.run_tests),
            # FindMPI from the MPI Spack chose, not whatever mpicc is first on PATH.
            self.define("MPI_C_COMPILER", self.spec["mpi"].mpicc),
        ]
        # Nothing else: the tools find their pattern and schema files beside themselves, <prefix>/share/ucp.
