#include "shuffle/comm.h"

#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <ctime>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ucp::shuffle {
namespace {

class LocalComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single process"; }
  void Alltoallv(const uint8_t* send, const std::vector<int64_t>& send_count, const std::vector<int64_t>& send_displ,
                 uint8_t* recv, const std::vector<int64_t>& recv_count, const std::vector<int64_t>& recv_displ) override {
    if (send_count[0] != recv_count[0]) throw Error("internal: self-exchange of unequal sizes");
    if (send_count[0] > 0) std::memcpy(recv + recv_displ[0], send + send_displ[0], static_cast<size_t>(send_count[0]));
  }
  void AllreduceSum(std::span<int64_t>) override {}
  void AllreduceMax(std::span<int64_t>) override {}
  std::vector<std::string> GatherToRoot(const std::string& mine) override { return {mine}; }
  void Barrier() override {}
  [[noreturn]] void Abort(int code) override { std::_Exit(code); }
};

void Check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("MPI ") + what + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

// Counts beyond INT_MAX do not fit MPI's int interface; the plan keeps chunks far below that.
std::vector<int> ToInt(const std::vector<int64_t>& v) {
  std::vector<int> out(v.size());
  for (size_t k = 0; k < v.size(); ++k) {
    if (v[k] < 0 || v[k] > INT_MAX) throw Error("internal: MPI message part of " + std::to_string(v[k]) + " bytes");
    out[k] = static_cast<int>(v[k]);
  }
  return out;
}

// Waits for a nonblocking collective without spinning. Open MPI's blocking collectives poll
// until the slowest rank arrives; on a node with a core per rank that polling takes the core
// from the rank's own writer threads (file writes and checksums), so a rank that waits slows the
// one it waits for. Here: a short spin for the common quick case, then sleeps that grow to 200 us
// with an MPI_Test (which also drives the transfer) between them.
void WaitSleeping(MPI_Request* request, const char* what) {
  int done = 0;
  for (int spins = 0; spins < 64 && !done; ++spins) Check(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
  for (long nanos = 5'000; !done; nanos = std::min<long>(nanos * 2, 200'000)) {
    timespec ts{0, nanos};
    nanosleep(&ts, nullptr);
    Check(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
  }
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "MPI (" + std::to_string(size_) + " ranks)"; }
  void Alltoallv(const uint8_t* send, const std::vector<int64_t>& send_count, const std::vector<int64_t>& send_displ,
                 uint8_t* recv, const std::vector<int64_t>& recv_count, const std::vector<int64_t>& recv_displ) override {
    auto sc = ToInt(send_count), sd = ToInt(send_displ), rc = ToInt(recv_count), rd = ToInt(recv_displ);
    MPI_Request req;
    Check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, MPI_COMM_WORLD, &req),
          "Alltoallv");
    WaitSleeping(&req, "Alltoallv");
  }
  void AllreduceSum(std::span<int64_t> v) override { Allreduce(v, MPI_SUM); }
  void AllreduceMax(std::span<int64_t> v) override { Allreduce(v, MPI_MAX); }
  std::vector<std::string> GatherToRoot(const std::string& mine) override {
    int n = static_cast<int>(mine.size());
    std::vector<int> sizes(rank_ == 0 ? size_ : 0), displs;
    MPI_Request req;
    Check(MPI_Igather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &req), "Gather");
    WaitSleeping(&req, "Gather");
    std::string all;
    if (rank_ == 0) {
      int64_t total = 0;
      for (int s : sizes) displs.push_back(static_cast<int>(total)), total += s;
      if (total > INT_MAX) throw Error("internal: gathered report exceeds 2 GiB");
      all.resize(static_cast<size_t>(total));
    }
    Check(MPI_Igatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD, &req),
          "Gatherv");
    WaitSleeping(&req, "Gatherv");
    std::vector<std::string> out;
    for (int r = 0; rank_ == 0 && r < size_; ++r) out.push_back(all.substr(displs[r], sizes[r]));
    return out;
  }
  void Barrier() override {
    MPI_Request req;
    Check(MPI_Ibarrier(MPI_COMM_WORLD, &req), "Barrier");
    WaitSleeping(&req, "Barrier");
  }
  [[noreturn]] void Abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }
  const void* mpi_comm() const override { return &world_; }

 private:
  void Allreduce(std::span<int64_t> v, MPI_Op op) {
    MPI_Request req;
    Check(MPI_Iallreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT64_T, op, MPI_COMM_WORLD, &req),
          "Allreduce");
    WaitSleeping(&req, "Allreduce");
  }

  int rank_ = 0, size_ = 1;
  MPI_Comm world_ = MPI_COMM_WORLD;
};

}  // namespace

std::unique_ptr<Comm> MakeLocalComm() { return std::make_unique<LocalComm>(); }

// Open MPI tells each rank, before MPI_Init, how many ranks the job has and how many of them share
// this node. When they all do, its ob1 layer over shared memory is what the job will use anyway,
// and choosing it skips opening the UCX and libfabric layers to probe network devices: about 0.2 s
// of every run's start-up, a fifth of a whole conversion of a 500 MB checkpoint. A choice made by the user (mpirun --mca pml,
// OMPI_MCA_pml) is left alone; other MPI libraries ignore the variable.
static void PreferSharedMemoryTransport() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (size && local && std::string(size) == local && !std::getenv("OMPI_MCA_pml")) setenv("OMPI_MCA_pml", "ob1", 0);
}

bool LaunchedByMpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

std::unique_ptr<Comm> MakeWorldComm(int* argc, char*** argv) {
  if (!LaunchedByMpi()) return MakeLocalComm();
  PreferSharedMemoryTransport();
  int provided = 0;
  Check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "Init");
  return std::make_unique<MpiComm>();
}

}  // namespace ucp::shuffle
