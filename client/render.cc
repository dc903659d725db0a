// CLI rendering (see render.h).
#include "client/render.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "proto/job_state_name.h"

namespace megatrain::client {
namespace {

std::string Bytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / double(1 << 30));
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / double(1 << 20));
  return absl::StrFormat("%d B", b);
}

}  // namespace

std::string DurationText(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  return s >= 3600 ? absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60)
         : s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60)
                   : absl::StrFormat("%ds", s);
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string JobLine(const v1::Job& job) {
  return absl::StrFormat("%s  %-9s  step %d/%d  loss %.4f  %s", job.id(),
                         v1::JobStateName(job.state()), job.progress().step(),
                         job.progress().total_steps(), job.progress().loss(), job.spec().name());
}

std::string JobDetails(const v1::Job& job) {
  const v1::Progress& p = job.progress();
  std::string out = absl::StrFormat(
      "job:             %s\nname:            %s\nstate:           %s\nstep:            %d/%d\n"
      "tokens:          %d\nloss:            %.4f\nvalidation loss: %.4f\n"
      "learning rate:   %.3e\ntokens/s:        %.0f\neta:             %s\n",
      job.id(), job.spec().name(), v1::JobStateName(job.state()), p.step(), p.total_steps(),
      p.tokens(), p.loss(), p.validation_loss(), p.learning_rate(), p.tokens_per_second(),
      DurationText(p.eta_seconds()));
  for (const v1::TierUsage& t : p.memory()) {
    absl::StrAppend(&out, absl::StrFormat("memory %-8s  %s\n", t.tier() + ":", Bytes(t.bytes())));
  }
  // Options that change how a step runs, not what it computes (off: no line).
  if (job.spec().speculative_update()) absl::StrAppend(&out, "speculative update: on\n");
  if (!job.failure_reason().empty())
    absl::StrAppend(&out, "failure:         ", job.failure_reason(), "\n");
  return out;
}

std::string DaemonStatusText(const v1::DaemonStatus& s) {
  std::string out = absl::StrFormat(
      "version:     %s\ndevice:      %s\nhealthy:     %s%s\nqueue:       %d\nrunning job: %s\n",
      s.version(), s.device(), s.healthy() ? "yes" : "NO",
      s.healthy() ? "" : absl::StrCat(" (", s.unhealthy_reason(), ")"), s.queue_length(),
      s.running_job_id().empty() ? "-" : s.running_job_id());
  absl::StrAppend(&out, "signing key: ", s.public_key().empty() ? "-" : s.public_key(),
                  " (ed25519; verify with megatrain verify DIR --pubkey FILE)\n");
  for (const v1::TierUsage& t : s.memory()) {
    absl::StrAppend(&out, absl::StrFormat("memory %-8s  %s of %s\n", t.tier() + ":",
                                          Bytes(t.bytes()), Bytes(t.budget_bytes())));
  }
  // Every device the daemon drives (an older daemon sends none: `device` above says it all).
  for (const v1::DeviceStatus& d : s.devices()) absl::StrAppend(&out, DeviceStatusLine(d), "\n");
  return out;
}

std::string DeviceStatusLine(const v1::DeviceStatus& d) {
  return absl::StrFormat(
      "device %-6s  %s  arena %s of %s  %s", absl::StrCat(d.index(), ":"), d.name(),
      Bytes(d.arena_in_use_bytes()), Bytes(d.arena_capacity_bytes()),
      d.healthy() ? "healthy" : absl::StrCat("UNHEALTHY (", d.unhealthy_reason(), ")"));
}

std::string AuditText(const v1::AuditLog& log) {
  std::string out;
  for (const v1::AuditEntry& e : log.entries()) {
    const bool bad = !log.chain_ok() && e.row() == log.first_bad_row();
    absl::StrAppend(
        &out,
        absl::StrFormat("%s row %d  seq %d  %s  %-24s %s\n", bad ? "BAD" : "  ", e.row(), e.seq(),
                        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(e.unix_ms()),
                                         absl::UTCTimeZone()),
                        e.kind(), e.message()));
  }
  if (log.chain_ok()) {
    absl::StrAppend(&out, "audit chain OK: ", log.entries_size(), " rows",
                    log.entries_size() > 0
                        ? absl::StrCat(", head ", log.entries(log.entries_size() - 1).hash())
                        : "",
                    "\n");
  } else {
    absl::StrAppend(&out, "audit chain BROKEN at row ", log.first_bad_row(), ": ", log.problem(),
                    "\n");
  }
  return out;
}

std::string PlanText(const v1::PlanResponse& plan) {
  std::string out = absl::StrFormat("parameters: %d\n", plan.parameters());
  if (plan.devices() > 1) absl::StrAppend(&out, absl::StrFormat("devices: %d\n", plan.devices()));
  if (plan.ranks() > 1) {
    absl::StrAppend(
        &out,
        absl::StrFormat("ranks: %d, up to %d on one machine (the buffers and tiers below are one "
                        "rank's%s)\n",
                        plan.ranks(), std::max<uint32_t>(1, plan.ranks_per_machine()),
                        plan.zero1() ? "; ZeRO-1: m and v the largest rank's share" : ""));
  }
  for (const v1::BufferPlacement& b : plan.placements()) {
    absl::StrAppend(
        &out, absl::StrFormat("buffer %-8s on %-7s %s\n", b.kind(), b.tier(), Bytes(b.bytes())));
  }
  for (const v1::TierUsage& t : plan.tiers()) {
    absl::StrAppend(&out,
                    absl::StrFormat("tier %-7s needs %s (budget %s)\n", t.tier(), Bytes(t.bytes()),
                                    t.budget_bytes() ? Bytes(t.budget_bytes()) : "-"));
  }
  absl::StrAppend(&out, absl::StrFormat("device arena peak (executor plan): %s\n",
                                        Bytes(plan.device_arena_peak_bytes())));
  if (!plan.speculative_update().empty()) absl::StrAppend(&out, plan.speculative_update(), "\n");
  if (plan.nvme_written_bytes_per_step() > 0 || plan.nvme_read_bytes_per_step() > 0) {
    absl::StrAppend(&out, absl::StrFormat("NVMe read/written per step: %s / %s\n",
                                          Bytes(plan.nvme_read_bytes_per_step()),
                                          Bytes(plan.nvme_written_bytes_per_step())));
    if (plan.nvme_written_bytes_per_run() > 0) {
      absl::StrAppend(&out, absl::StrFormat("NVMe written per run: %s\n",
                                            Bytes(plan.nvme_written_bytes_per_run())));
    }
    if (plan.predicted_step_seconds() > 0) {
      absl::StrAppend(
          &out, absl::StrFormat("NVMe written per day: %.2f TB (at the predicted step time)\n",
                                plan.nvme_written_bytes_per_step() * 86400.0 /
                                    plan.predicted_step_seconds() / 1e12));
    }
  }
  for (const std::string& w : plan.warnings()) absl::StrAppend(&out, w, "\n");
  return out;
}

std::string ProgressLine(const v1::ProgressEvent& e, bool bar) {
  const v1::Progress& p = e.progress();
  std::string out;
  if (bar) {
    const int width = 30;
    const int filled =
        p.total_steps() == 0
            ? 0
            : static_cast<int>(width * std::min<uint64_t>(p.step(), p.total_steps()) /
                               p.total_steps());
    out = absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "] ");
  }
  absl::StrAppend(
      &out, absl::StrFormat("%s %s step %d/%d loss %.4f", e.job_id(), v1::JobStateName(e.state()),
                            p.step(), p.total_steps(), p.loss()));
  if (!std::isnan(p.validation_loss())) {
    absl::StrAppend(&out, absl::StrFormat(" val %.4f", p.validation_loss()));
  }
  absl::StrAppend(&out, absl::StrFormat(" %.0f tok/s eta %s", p.tokens_per_second(),
                                        DurationText(p.eta_seconds())));
  if (!e.message().empty()) absl::StrAppend(&out, "  ", e.message());
  return out;
}

std::string FitToWidth(const std::string& line, int columns) {
  std::string out;
  out.reserve(line.size());
  int shown = 0;
  for (size_t i = 0; i < line.size();) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    const size_t length = c < 0x80           ? 1
                          : (c >> 5) == 0x6  ? 2
                          : (c >> 4) == 0xe  ? 3
                          : (c >> 3) == 0x1e ? 4
                                             : 1;
    if (columns > 0 && shown == columns) break;
    if (c == '\n' || c == '\r' || c == '\t') {
      out.push_back(' ');
    } else {
      out.append(line, i, std::min(length, line.size() - i));
    }
    ++shown;
    i += length;
  }
  return out;
}

}  // namespace megatrain::client
