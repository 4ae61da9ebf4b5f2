#include "core/build_info.h"

#define OMPI_SKIP_MPICXX 1  // the C API's version macros only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <H5public.h>

#include "build_commit.h"

namespace ucp {

const char* Version() { return UCP_VERSION; }

const char* GitCommit() { return UCP_GIT_COMMIT; }

std::string VersionText(const std::string& tool) {
  std::string mpi = "MPI " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION);
#ifdef OMPI_MAJOR_VERSION
  mpi = "Open MPI " + std::to_string(OMPI_MAJOR_VERSION) + "." + std::to_string(OMPI_MINOR_VERSION) + "." +
        std::to_string(OMPI_RELEASE_VERSION);
#endif
  return tool + " " + Version() + " (commit " + GitCommit() + ", " + UCP_BUILD_TYPE + " build; " + mpi + ", HDF5 " +
         std::to_string(H5_VERS_MAJOR) + "." + std::to_string(H5_VERS_MINOR) + "." + std::to_string(H5_VERS_RELEASE) + ")";
}

}  // namespace ucp
