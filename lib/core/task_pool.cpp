#include "core/task_pool.h"

#include <sched.h>

namespace ucp {

TaskPool::TaskPool(int threads, int64_t byte_cap) : cap_(byte_cap) {
  for (int k = 0; k < std::max(1, threads); ++k) threads_.emplace_back([this] { Work(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  has_work_.notify_all();
  for (auto& t : threads_) t.join();
}

void TaskPool::RethrowLocked() {
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void TaskPool::Submit(int64_t bytes, std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mu_);
  has_room_.wait(lock, [&] { return error_ || held_ == 0 || held_ + bytes <= cap_; });
  RethrowLocked();
  held_ += bytes;
  queue_.push_back({bytes, std::move(task)});
  has_work_.notify_one();
}

void TaskPool::WaitUntilHolding(int64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  has_room_.wait(lock, [&] { return error_ || held_ <= std::max<int64_t>(0, bytes); });
  RethrowLocked();
}

void TaskPool::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  has_room_.wait(lock, [&] { return error_ || (queue_.empty() && running_ == 0); });
  RethrowLocked();
}

void TaskPool::Work() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      has_work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    std::exception_ptr failure;
    try {
      task.fn();
    } catch (...) {
      failure = std::current_exception();
    }
    task.fn = nullptr;  // release what the task held before the bytes count as free
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
      held_ -= task.bytes;
      if (failure && !error_) error_ = failure;
    }
    has_room_.notify_all();
  }
}

int AvailableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace ucp
