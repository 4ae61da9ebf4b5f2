# CMake toolchain file: cross-compiles ucp for aarch64 (arm64) Linux, e.g. GH200 / Grace, with Debian's cross
# compiler (g++-aarch64-linux-gnu) against an arm64 Debian sysroot holding the libraries ucp links
# (libopenmpi-dev, libhdf5-openmpi-dev, zlib1g-dev, libdeflate-dev, libxxhash-dev, libstdc++-12-dev) and the
# header-only ones (libcli11-dev, nlohmann-json3-dev, catch2). scripts/aarch64_check.sh builds that sysroot and
# uses this file; by hand:
#   UCP_AARCH64_SYSROOT=/path/to/sysroot cmake -S . -B build-aarch64 \
#     -DCMAKE_TOOLCHAIN_FILE=scripts/aarch64-linux-gnu.cmake && cmake --build build-aarch64
# The sysroot comes from the environment variable UCP_AARCH64_SYSROOT (or -DUCP_AARCH64_SYSROOT=...). Test
# executables then run through qemu-user (CMAKE_CROSSCOMPILING_EMULATOR) with the sysroot's loader and libraries.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT UCP_AARCH64_SYSROOT)
  set(UCP_AARCH64_SYSROOT "$ENV{UCP_AARCH64_SYSROOT}")
endif()
if(NOT UCP_AARCH64_SYSROOT OR NOT EXISTS "${UCP_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu")
  message(FATAL_ERROR "scripts/aarch64-linux-gnu.cmake: set UCP_AARCH64_SYSROOT to an arm64 Debian sysroot "
                      "(scripts/aarch64_check.sh builds one); got '${UCP_AARCH64_SYSROOT}'")
endif()
# try_compile projects re-read this file: hand them the sysroot too.
set(ENV{UCP_AARCH64_SYSROOT} "${UCP_AARCH64_SYSROOT}")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES UCP_AARCH64_SYSROOT)

set(CMAKE_SYSROOT "${UCP_AARCH64_SYSROOT}")
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH "${UCP_AARCH64_SYSROOT}")
# Programs (python3, git) are the host's; libraries, headers and CMake packages only the sysroot's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config (FindMPI asks it first) sees only the sysroot's .pc files, with the sysroot prefixed to their paths.
set(ENV{PKG_CONFIG_LIBDIR} "${UCP_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${UCP_AARCH64_SYSROOT}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${UCP_AARCH64_SYSROOT}")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L "${UCP_AARCH64_SYSROOT}")

# Open MPI: its mpicc wrapper is an arm64 program (and the host's /usr/bin/mpicc would hand FindMPI the x86-64
# paths), so FindMPI is given Debian's arm64 header folder and library instead of asking a wrapper.
set(_ucp_ompi "${UCP_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu/openmpi")
set(MPI_C_COMPILER "MPI_C_COMPILER-NOTFOUND" CACHE FILEPATH "no MPI wrapper when cross-compiling")
set(MPI_SKIP_COMPILER_WRAPPER TRUE)
set(MPI_C_HEADER_DIR "${_ucp_ompi}/include" CACHE PATH "")
set(MPI_C_ADDITIONAL_INCLUDE_DIRS "${_ucp_ompi}/include/openmpi" CACHE STRING "")
set(MPI_C_LIB_NAMES mpi CACHE STRING "")
set(MPI_mpi_LIBRARY "${_ucp_ompi}/lib/libmpi.so" CACHE FILEPATH "")
# The arm64 mpiexec: runs under qemu-user only where binfmt_misc hands arm64 programs to qemu.
set(MPIEXEC_EXECUTABLE "${UCP_AARCH64_SYSROOT}/usr/bin/mpiexec.openmpi" CACHE FILEPATH "")

# Parallel HDF5: Debian keeps the Open MPI build in its own folders (its h5pcc wrapper is an arm64 program too).
set(HDF5_C_COMPILER_EXECUTABLE "HDF5_C_COMPILER_EXECUTABLE-NOTFOUND" CACHE FILEPATH "")
set(HDF5_ROOT "${UCP_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu/hdf5/openmpi")
set(HDF5_C_INCLUDE_DIR "${UCP_AARCH64_SYSROOT}/usr/include/hdf5/openmpi" CACHE PATH "")
