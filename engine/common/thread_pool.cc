// ThreadPool implementation: one mutex, a queue of task batches, and two
// condition variables (work available, batch finished).
#include "engine/common/thread_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace megatrain::engine {

// A submission of n_tasks calls of fn. All fields are guarded by the pool's mutex.
struct TaskHandle::Batch {
  std::function<void(size_t)> fn;
  size_t n_tasks = 0;
  size_t next_task = 0;  // next unclaimed task
  size_t finished = 0;   // tasks that have returned
};

TaskHandle& TaskHandle::operator=(TaskHandle&& other) noexcept {
  if (this != &other) {
    Wait();
    pool_ = std::exchange(other.pool_, nullptr);
    batch_ = std::move(other.batch_);
  }
  return *this;
}

TaskHandle::~TaskHandle() { Wait(); }

void TaskHandle::Wait() {
  if (batch_ == nullptr) return;
  pool_->WaitFor(batch_.get());
  batch_.reset();
  pool_ = nullptr;
}

bool TaskHandle::Done() const {
  if (batch_ == nullptr) return true;
  std::lock_guard<std::mutex> lock(pool_->mu_);
  return batch_->finished == batch_->n_tasks;
}

ThreadPool::ThreadPool(size_t num_threads) {
  if (num_threads == 0) {
    std::fprintf(stderr, "ThreadPool: num_threads must be >= 1\n");
    std::abort();
  }
  workers_.reserve(num_threads);
  for (size_t i = 0; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::ParallelFor(size_t n_tasks, const std::function<void(size_t task)>& fn) {
  if (n_tasks == 0) return;
  SubmitParallelFor(n_tasks, fn).Wait();
}

TaskHandle ThreadPool::SubmitParallelFor(size_t n_tasks, std::function<void(size_t task)> fn) {
  if (n_tasks == 0) return TaskHandle();
  auto batch = std::make_shared<Batch>();
  batch->fn = std::move(fn);
  batch->n_tasks = n_tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(batch);
  }
  if (n_tasks == 1) {
    work_available_.notify_one();
  } else {
    work_available_.notify_all();
  }
  return TaskHandle(this, std::move(batch));
}

TaskHandle ThreadPool::Submit(std::function<void()> fn) {
  return SubmitParallelFor(1, [fn = std::move(fn)](size_t) { fn(); });
}

bool ThreadPool::RunOneQueuedTask(std::unique_lock<std::mutex>& lock, Batch* only_this) {
  std::shared_ptr<Batch> batch;
  if (only_this != nullptr) {
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [only_this](const auto& b) { return b.get() == only_this; });
    if (it == queue_.end()) return false;
    batch = *it;
  } else {
    if (queue_.empty()) return false;
    batch = queue_.front();
  }
  const size_t task = batch->next_task++;
  if (batch->next_task == batch->n_tasks) {
    queue_.erase(std::find(queue_.begin(), queue_.end(), batch));
  }
  lock.unlock();
  batch->fn(task);
  lock.lock();
  if (++batch->finished == batch->n_tasks) batch_finished_.notify_all();
  return true;
}

void ThreadPool::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_available_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    RunOneQueuedTask(lock, nullptr);
  }
}

bool ThreadPool::IsWorkerThread() const {
  const std::thread::id self = std::this_thread::get_id();
  return std::any_of(workers_.begin(), workers_.end(),
                     [self](const std::thread& t) { return t.get_id() == self; });
}

void ThreadPool::WaitFor(Batch* batch) {
  std::unique_lock<std::mutex> lock(mu_);
  if (IsWorkerThread()) {
    // A worker waiting on the pool must not sleep while its own tasks sit in
    // the queue: with every worker waiting, nobody would run them.
    while (RunOneQueuedTask(lock, batch)) {
    }
  }
  batch_finished_.wait(lock, [batch] { return batch->finished == batch->n_tasks; });
}

}  // namespace megatrain::engine
