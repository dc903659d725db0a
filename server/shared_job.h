// SharedJob: one job's v1::Job, copy-on-write, so request threads take a snapshot under the
// runner's lock in O(1) (a reference count) and copy it after releasing the lock; the writer
// (always under the runner's lock) clones only while such a snapshot is alive.
#pragma once

#include <memory>
#include <utility>

#include "proto/megatrain.pb.h"

namespace megatrain::server {

class SharedJob {
 public:
  SharedJob() : job_(std::make_shared<v1::Job>()) {}
  explicit SharedJob(v1::Job job) : job_(std::make_shared<v1::Job>(std::move(job))) {}
  SharedJob(const SharedJob&) = delete;
  SharedJob& operator=(const SharedJob&) = delete;
  SharedJob(SharedJob&&) = default;
  SharedJob& operator=(SharedJob&&) = default;

  const v1::Job& operator*() const { return *job_; }
  const v1::Job* operator->() const { return job_.get(); }

  // The job to change in place; clones it first when a snapshot still shares it.
  v1::Job& Mutable() {
    if (job_.use_count() > 1) job_ = std::make_shared<v1::Job>(*job_);
    return *job_;
  }
  // An immutable view that later Mutable() calls never change.
  std::shared_ptr<const v1::Job> Snapshot() const { return job_; }

 private:
  std::shared_ptr<v1::Job> job_;
};

}  // namespace megatrain::server
