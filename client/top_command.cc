// `megatrain top` (see top_command.h).
#include "client/top_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/exit_codes.h"
#include "client/render.h"
#include "grpcpp/client_context.h"
#include "proto/job_state_name.h"

namespace megatrain::client {
namespace {

std::string Gib(uint64_t bytes) { return absl::StrFormat("%.1f", bytes / double(1 << 30)); }

std::string Bar(uint64_t step, uint64_t total) {
  constexpr int kWidth = 16;
  const double done = total == 0 ? 0.0 : std::min(1.0, double(step) / double(total));
  const int filled = static_cast<int>(done * kWidth);
  return absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "] ",
                      absl::StrFormat("%3d%%", static_cast<int>(done * 100)));
}

std::string Number(double value, const char* format) {
  return std::isfinite(value) ? absl::StrFormat(format, value) : "-";
}

bool Active(v1::JobState s) { return s == v1::RUNNING || s == v1::PAUSED || s == v1::QUEUED; }

int Rank(v1::JobState s) {
  return s == v1::RUNNING ? 0 : s == v1::PAUSED ? 1 : s == v1::QUEUED ? 2 : 3;
}

}  // namespace

std::string TopScreen(const v1::DaemonStatus& status, const std::vector<v1::Job>& jobs,
                      absl::Time now, int columns, int rows, const std::string& error) {
  std::vector<std::string> lines;
  lines.push_back(absl::StrCat(
      "megatrain top  ", absl::FormatTime("%Y-%m-%d %H:%M:%S", now, absl::LocalTimeZone())));
  if (!error.empty()) {
    lines.push_back(absl::StrCat("daemon unreachable: ", error));
  } else {
    lines.push_back(absl::StrCat(status.version(), "  device ", status.device(), "  ",
                                 status.healthy() ? "healthy"
                                                  : absl::StrCat("UNHEALTHY: ",
                                                                 status.unhealthy_reason()),
                                 "  queue ", status.queue_length(), "  running ",
                                 status.running_job_id().empty() ? "-" : status.running_job_id()));
    std::string memory = "memory GiB";
    for (const v1::TierUsage& t : status.memory()) {
      absl::StrAppend(&memory, "  ", t.tier(), " ", Gib(t.bytes()),
                      t.budget_bytes() > 0 ? absl::StrCat("/", Gib(t.budget_bytes())) : "");
    }
    lines.push_back(memory);
    // Every device the daemon drives, as daemon-status lists them (an older daemon sends none:
    // the `device` above says it all).
    for (const v1::DeviceStatus& d : status.devices()) lines.push_back(DeviceStatusLine(d));
    lines.push_back("");
    lines.push_back(absl::StrFormat("%-12s %-9s %-22s %8s %8s %9s %7s  %s", "JOB", "STATE",
                                    "PROGRESS", "LOSS", "VAL", "TOK/S", "ETA", "NAME"));
    std::vector<const v1::Job*> order;
    for (const v1::Job& j : jobs) order.push_back(&j);
    std::stable_sort(order.begin(), order.end(), [](const v1::Job* a, const v1::Job* b) {
      if (Rank(a->state()) != Rank(b->state())) return Rank(a->state()) < Rank(b->state());
      if (Active(a->state())) return a->id() < b->id();    // in queue order
      return a->finished_unix_ms() > b->finished_unix_ms();  // newest first
    });
    const size_t room =
        rows > 0 ? static_cast<size_t>(std::max(0, rows - static_cast<int>(lines.size()) - 1))
                 : order.size();
    for (size_t i = 0; i < order.size() && i < room; ++i) {
      const v1::Job& j = *order[i];
      const v1::Progress& p = j.progress();
      const bool running = j.state() == v1::RUNNING;
      lines.push_back(absl::StrFormat(
          "%-12s %-9s %-22s %8s %8s %9s %7s  %s", j.id(), v1::JobStateName(j.state()),
          Bar(p.step(), p.total_steps()), p.step() > 0 ? Number(p.loss(), "%.4f") : "-",
          Number(p.validation_loss(), "%.4f"),
          running ? Number(p.tokens_per_second(), "%.0f") : "-",
          running ? DurationText(p.eta_seconds()) : "-", j.spec().name()));
    }
    if (order.size() > room) {
      lines.push_back(absl::StrCat("... ", order.size() - room, " more (megatrain list)"));
    }
    if (order.empty()) lines.push_back("no jobs");
  }
  std::string out;
  for (const std::string& line : lines) absl::StrAppend(&out, FitToWidth(line, columns), "\n");
  return out;
}

int RunTop(v1::Trainer::Stub& stub, const TopOptions& options) {
  int code = kExitOk;
  for (int drawn = 0; options.iterations == 0 || drawn < options.iterations; ++drawn) {
    if (drawn > 0) std::this_thread::sleep_for(absl::ToChronoMilliseconds(options.interval));
    v1::DaemonStatus status;
    std::vector<v1::Job> jobs;
    std::string error;
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_deadline));
      const grpc::Status s = stub.GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status);
      if (!s.ok()) error = s.error_message();
    }
    v1::ListJobsRequest request;
    while (error.empty()) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_deadline));
      v1::ListJobsResponse page;
      const grpc::Status s = stub.ListJobs(&context, request, &page);
      if (!s.ok()) {
        error = s.error_message();
        break;
      }
      for (v1::Job& j : *page.mutable_jobs()) jobs.push_back(std::move(j));
      if (page.next_page_token().empty()) break;
      request.set_page_token(page.next_page_token());
    }
    code = error.empty() ? kExitOk : kExitUnreachable;
    const std::string screen =
        TopScreen(status, jobs, absl::Now(), options.columns, options.rows, error);
    // Home and clear, then the screen: one write, so the terminal never shows half of it.
    std::fputs(options.redraw ? absl::StrCat("\033[H\033[2J", screen).c_str() : screen.c_str(),
               stdout);
    std::fflush(stdout);
  }
  return code;
}

}  // namespace megatrain::client
