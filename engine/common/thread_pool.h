// ThreadPool: a fixed set of worker threads that block on condition variables
// (nothing spins), with blocking ParallelFor and move-only task handles.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace megatrain::engine {

class ThreadPool;

// Completion handle of work submitted to a ThreadPool. Move-only; waits for
// the work in its destructor, so callables may safely capture locals.
class TaskHandle {
 public:
  TaskHandle() = default;
  TaskHandle(TaskHandle&&) noexcept = default;
  TaskHandle& operator=(TaskHandle&& other) noexcept;
  TaskHandle(const TaskHandle&) = delete;
  TaskHandle& operator=(const TaskHandle&) = delete;
  ~TaskHandle();

  // Blocks until every task of the submission has run. Called from a worker
  // of the same pool it runs unclaimed tasks itself, so nesting never
  // deadlocks. A no-op on an empty (default-constructed or moved-from) handle.
  void Wait();
  // True once every task has run (true for an empty handle).
  bool Done() const;

 private:
  friend class ThreadPool;
  struct Batch;
  TaskHandle(ThreadPool* pool, std::shared_ptr<Batch> batch)
      : pool_(pool), batch_(std::move(batch)) {}

  ThreadPool* pool_ = nullptr;
  std::shared_ptr<Batch> batch_;
};

class ThreadPool {
 public:
  // Starts num_threads workers; num_threads must be >= 1 (CHECKed).
  explicit ThreadPool(size_t num_threads);
  // Runs everything already submitted, then joins the workers. Every
  // TaskHandle of this pool must have been waited on or destroyed before.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t num_threads() const { return workers_.size(); }

  // Runs fn(0) .. fn(n_tasks - 1) on the workers and returns when all are
  // done. Which worker runs which task is unspecified: callers that reduce
  // must write per-task partials and combine them in task order.
  void ParallelFor(size_t n_tasks, const std::function<void(size_t task)>& fn);

  // Asynchronous ParallelFor; the handle's Wait() is the join point.
  TaskHandle SubmitParallelFor(size_t n_tasks, std::function<void(size_t task)> fn);

  // Runs fn once on a worker.
  TaskHandle Submit(std::function<void()> fn);

 private:
  friend class TaskHandle;
  using Batch = TaskHandle::Batch;

  void WorkerLoop();
  // Claims and runs one task of the front batch; lock is held on entry and
  // exit, released while the task runs. Returns false when nothing is queued.
  bool RunOneQueuedTask(std::unique_lock<std::mutex>& lock, Batch* only_this);
  bool IsWorkerThread() const;
  void WaitFor(Batch* batch);

  std::mutex mu_;
  std::condition_variable work_available_;
  std::condition_variable batch_finished_;
  std::deque<std::shared_ptr<Batch>> queue_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace megatrain::engine
