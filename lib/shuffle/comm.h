// The few collective operations the pipeline needs, behind one interface: MPI when the program
// was started by mpirun/srun, a single in-process rank otherwise (no mpirun needed, no MPI_Init).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ucp::shuffle {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "MPI (4 ranks)" or "single process"

  // Every rank sends send[displ[r] .. displ[r]+count[r]) to rank r and receives from rank r into
  // recv at recv_displ[r]. Counts are in bytes and known to both sides from the plan.
  virtual void Alltoallv(const uint8_t* send, const std::vector<int64_t>& send_count,
                         const std::vector<int64_t>& send_displ, uint8_t* recv,
                         const std::vector<int64_t>& recv_count, const std::vector<int64_t>& recv_displ) = 0;
  virtual void AllreduceSum(std::span<int64_t> values) = 0;
  virtual void AllreduceMax(std::span<int64_t> values) = 0;
  // Rank 0 receives every rank's string, in rank order; other ranks receive nothing.
  virtual std::vector<std::string> GatherToRoot(const std::string& mine) = 0;
  virtual void Barrier() = 0;
  // Ends the whole job at once (a rank that cannot go on while others wait in a collective).
  [[noreturn]] virtual void Abort(int code) = 0;
  // A pointer to the MPI_Comm behind this communicator, for MPI-IO (the HDF5 store); nullptr for
  // the single-process one. Kept opaque so that this header does not need <mpi.h>.
  virtual const void* mpi_comm() const { return nullptr; }
};

// The single-process communicator.
std::unique_ptr<Comm> MakeLocalComm();

// MPI_COMM_WORLD when launched by an MPI starter (environment of mpirun, srun, hydra), else the
// single-process communicator. Initialises MPI when it is used; finalised at exit.
std::unique_ptr<Comm> MakeWorldComm(int* argc, char*** argv);
bool LaunchedByMpi();

}  // namespace ucp::shuffle
