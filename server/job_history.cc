// JobHistories (see job_history.h).
#include "server/job_history.h"

#include <cmath>

namespace megatrain::server {

void JobHistories::Record(const std::string& id, const engine::StepReport& report,
                          double validation_loss, int64_t unix_ms) {
  v1::StepSample step;
  step.set_step(report.step);
  step.set_unix_ms(unix_ms);
  step.set_loss(report.loss);
  step.set_learning_rate(report.learning_rate);
  step.set_grad_norm(report.grad_norm);
  step.set_tokens_per_second(report.tokens_per_second);
  step.set_skipped(report.skipped);
  std::lock_guard<std::mutex> lock(mu_);
  History& h = jobs_.try_emplace(id, samples_).first->second;
  h.steps.Add(step);
  if (std::isfinite(validation_loss)) {
    const v1::ValidationSample* last = h.validation.Last();
    // The engine reports its latest evaluation with every step: a sample per new evaluation
    // (a redone step after a resume records it again).
    if (last == nullptr || last->validation_loss() != validation_loss ||
        last->step() >= report.step) {
      v1::ValidationSample v;
      v.set_step(report.step);
      v.set_validation_loss(validation_loss);
      h.validation.Add(v);
    }
  }
  v1::JobHistory& latest = h.latest;
  if (!report.layers.empty()) {
    latest.clear_layers();
    for (const engine::LayerTiming& t : report.layers) {
      v1::LayerTimingSample* l = latest.add_layers();
      l->set_copy_in_seconds(t.copy_in_seconds);
      l->set_compute_seconds(t.compute_seconds);
      l->set_copy_out_seconds(t.copy_out_seconds);
      l->set_stall_seconds(t.stall_seconds);
      l->set_optimizer_seconds(t.optimizer_seconds);
    }
    latest.set_layers_step(report.step);
  }
  latest.set_step_seconds(report.step_seconds);
  latest.set_total_stall_seconds(report.total_stall_seconds);
  latest.set_nvme_bytes_read(latest.nvme_bytes_read() + report.nvme_bytes_read);
  latest.set_nvme_bytes_written(latest.nvme_bytes_written() + report.nvme_bytes_written);
}

void JobHistories::RecordEvalReplies(const std::string& id,
                                     const std::vector<v1::EvalReply>& replies) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::JobHistory& latest = jobs_.try_emplace(id, samples_).first->second.latest;
  latest.clear_eval_replies();
  for (const v1::EvalReply& r : replies) *latest.add_eval_replies() = r;
}

std::optional<v1::JobHistory> JobHistories::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  v1::JobHistory out = it->second.latest;
  out.set_job_id(id);
  out.set_stride(it->second.steps.stride());
  for (const v1::StepSample& s : it->second.steps.Samples()) *out.add_steps() = s;
  for (const v1::ValidationSample& v : it->second.validation.Samples()) *out.add_validation() = v;
  return out;
}

void JobHistories::Remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.erase(id);
}

}  // namespace megatrain::server
