// Test helpers for device tests: bounded waits that fail loudly instead of hanging.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "absl/status/status.h"
#include "engine/device/device.h"

namespace megatrain::engine::testing {

// Stream::Synchronize, but a hang of more than `limit` aborts the test with a message.
inline absl::Status SynchronizeWithin(Stream& stream,
                                      std::chrono::seconds limit = std::chrono::seconds(30)) {
  std::packaged_task<absl::Status()> task([&stream] { return stream.Synchronize(); });
  std::future<absl::Status> result = task.get_future();
  std::thread waiter(std::move(task));
  if (result.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "stream '%.*s' did not synchronize within %lld s\n",
                 static_cast<int>(stream.name().size()), stream.name().data(),
                 static_cast<long long>(limit.count()));
    std::abort();
  }
  waiter.join();
  return result.get();
}

}  // namespace megatrain::engine::testing
