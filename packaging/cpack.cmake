# CPack settings for a Debian package of ucp: `cpack -G DEB` in a configured and built build folder writes
# ucp_<version>_<arch>.deb. Included from the top-level CMakeLists.txt after every install() rule, so the
# package holds exactly what `cmake --install` lays out (bin/ucp-*, share/ucp, and share/man once the man
# pages are installed) under /usr, and nothing of tests/ (which has no install rules). Tested by
# scripts/deb_check.sh (by hand, before a release; see packaging/README.md).

set(CPACK_PACKAGE_NAME "ucp")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "The ucp developers")
# Debian requires a Maintainer: "Name <address>". The project has no published address yet: whoever builds a
# package for others sets theirs, e.g. -DUCP_DEB_MAINTAINER="Jane Doe <jane@example.org>".
set(UCP_DEB_MAINTAINER "ucp developers <ucp@localhost.invalid>" CACHE STRING
    "The Maintainer: field of the Debian package (Name <address>)")
set(CPACK_PACKAGE_CONTACT "${UCP_DEB_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Universal Checkpointing: convert and reshard LLM training checkpoints")
# The long description; CPackDeb indents it and turns its empty lines into " .", as debian/control wants.
set(CPACK_PACKAGE_DESCRIPTION
    "ucp reads a distributed training checkpoint (DeepSpeed ZeRO stages 0-3 with tensor, pipeline, sequence
and expert parallelism, Megatron-LM, Megatron-Core torch_dist, PyTorch DCP, Hugging Face Trainer) into one
atomic checkpoint of whole tensors, and writes it back out at another parallel layout or as a Hugging Face
model.

Three MPI tools: ucp-convert (source to atomic checkpoint), ucp-inspect (what a checkpoint holds, and
--verify of its checksums) and ucp-reshard (atomic checkpoint to a new layout). Run them with mpirun, one
rank or many; the atomic checkpoint is stored in parallel HDF5.")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CPACK_PACKAGE_CONTACT}")
set(CPACK_DEBIAN_PACKAGE_SECTION "science")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # ucp_<version>_<arch>.deb, Debian's own naming
# The architecture dpkg builds for (amd64, arm64, ...), as the binaries inside are.
find_program(UCP_DPKG dpkg)
if(UCP_DPKG)
  execute_process(COMMAND "${UCP_DPKG}" --print-architecture OUTPUT_VARIABLE CPACK_DEBIAN_PACKAGE_ARCHITECTURE
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
# dpkg-shlibdeps turns the libraries the tools link (libhdf5-openmpi, libopenmpi, libdeflate, libxxhash,
# zlib, libstdc++) into the Debian packages that ship them, with their minimum versions. mpirun itself is no
# library, and users launch the tools with it: openmpi-bin, named here.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "openmpi-bin")

include(CPack)
