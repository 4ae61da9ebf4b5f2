// A few worker threads running submitted tasks, with a cap on the bytes the queued and running
// tasks hold: Submit blocks while the cap would be exceeded, which bounds memory when a producer
// (the reducer) is faster than the consumers (the writers). The first task error is rethrown by
// the next Submit or by Drain.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ucp {

class TaskPool {
 public:
  TaskPool(int threads, int64_t byte_cap);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Submit(int64_t bytes, std::function<void()> task);
  // Blocks until the queued and running tasks hold at most `bytes` (0: until they are all done),
  // for a producer about to take memory of its own; rethrows a task's error.
  void WaitUntilHolding(int64_t bytes);
  void Drain();

 private:
  void Work();
  void RethrowLocked();
  struct Task {
    int64_t bytes;
    std::function<void()> fn;
  };
  std::mutex mu_;
  std::condition_variable has_work_, has_room_;
  std::deque<Task> queue_;
  int64_t held_ = 0, cap_;
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

// CPU cores this process may run on (what mpirun's binding gave the rank).
int AvailableCores();

}  // namespace ucp
