// Named points on every write path, where a test can make the process kill itself (SIGKILL, as a
// node failure would) or log that it passed. They cost one branch unless the environment asks:
//   UCP_TEST_KILL_AT=NAME:N   SIGKILL at the Nth passing of point NAME in this process (N from 1);
//   UCP_TEST_KILL_RANK=R      ... only in the MPI rank R (OMPI_COMM_WORLD_RANK; 0 without mpirun);
//   UCP_TEST_FAULT_LOG=PATH   append "RANK NAME N PATH" for every point passed, in order.
// The points (the tests in tests/python/kill_anywhere.py choose among what the log shows):
//   file-open      a temporary created (core/atomic_file.h);  file-write   one write(2) of it done;
//   file-written   all its bytes written, not yet synced;      file-synced  fsync done, not renamed;
//   file-renamed   under its final name, folder not synced;   sync         a whole batch synced;
//   journal        a line appended to a resume journal;        lock-taken   an output lock held;
//   h5-dataset     one HDF5 dataset written;                   h5-closed    atoms.h5 whole, not renamed;
//   part-written   a part of a split tensor in its shared file (store/atom_store.h, WritePart).
#pragma once

#include <string>

namespace ucp {

void FaultPoint(const char* name, const std::string& path = "");

}  // namespace ucp
