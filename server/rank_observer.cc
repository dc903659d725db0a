// RankObserver (see rank_observer.h).
#include "server/rank_observer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "server/rank_protocol.h"

namespace megatrain::server {

void EmitLine(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(STDOUT_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the daemon is gone: mpirun ends the ranks
    done += static_cast<size_t>(n);
  }
}

void RankObserver::OnLine(const std::string& line, bool keep) {
  if (speaks_) EmitLine(RankLineEvent(line, keep));
}

void RankObserver::OnStep(const engine::StepReport& report, double validation_loss) {
  if (first_step_ == 0) first_step_ = report.step;
  last_step_ = report.step;
  if (!speaks_) return;
  // The job's step as one: every rank ran the same number of micro-batches of the same shape,
  // and the step's collectives end it on every rank together.
  engine::StepReport job_step = report;
  job_step.tokens *= ranks_;
  job_step.tokens_per_second *= ranks_;
  EmitLine(RankStepEvent(job_step, validation_loss));
}

bool RankObserver::ShouldStop() {
  // The test hook: rank 0 waits before each step past the hold for a request, the others for
  // rank 0 in the ranks' agreement (a collective).
  if (speaks_ && hold_after_step_ != 0 && first_step_ != 0 && first_step_ <= hold_after_step_ &&
      last_step_ >= hold_after_step_) {
    while (!requests_.pause && !requests_.checkpoint) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return requests_.pause;
}

void RankObserver::OnCheckpoint(uint64_t step, const std::string& path) {
  if (speaks_) EmitLine(RankCheckpointEvent(step, path));
}

void RankObserver::OnResult(engine::TrainingRunResult result) {
  if (!speaks_) return;
  result.tokens_per_second *= ranks_;
  EmitLine(RankResultEvent(result));
}

void RankObserver::OnStopped(const std::string& why) {
  if (speaks_) EmitLine(RankStoppedEvent(why));
}

}  // namespace megatrain::server
