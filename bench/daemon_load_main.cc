// daemon_load: load on a running megatraind while a job trains. Phase 1 samples the job's
// tokens/s quietly; phase 2 adds pollers (GetJob/ListJobs at a fixed rate each) and watchers
// (WatchJob streams) and samples again. Prints both medians, the drop and failed RPCs; exits 1
// when any RPC failed or the drop reaches --max_drop.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "grpcpp/create_channel.h"
#include "proto/megatrain.grpc.pb.h"

ABSL_FLAG(std::string, socket, "", "megatraind's Unix socket.");
ABSL_FLAG(std::string, job_id, "", "The running job to measure.");
ABSL_FLAG(int, seconds, 60, "Length of each phase.");
ABSL_FLAG(int, pollers, 40, "Clients calling GetJob/ListJobs.");
ABSL_FLAG(int, poll_hz, 10, "Calls per second per poller.");
ABSL_FLAG(int, watchers, 10, "Clients holding WatchJob streams.");
ABSL_FLAG(double, max_drop, 0.05, "Largest acceptable relative tokens/s drop.");
ABSL_FLAG(int, daemon_pid, 0,
          "megatraind's pid: reports its CPU time per phase (0 = not reported).");

namespace {

// CPU seconds (user + system) of a process from /proc/PID/stat; 0 if unknown.
double ProcessCpuSeconds(int pid) {
  if (pid <= 0) return 0;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

using namespace megatrain;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Samples the job's tokens/s once per second (a new step's figure each time it changes).
std::vector<double> Sample(v1::Trainer::Stub& stub, const std::string& id, int seconds,
                           std::atomic<long>& failures) {
  std::vector<double> samples;
  uint64_t last_step = 0;
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  for (auto next = Clock::now(); next < end; next += std::chrono::seconds(1)) {
    std::this_thread::sleep_until(next);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetJobRequest request;
    request.set_id(id);
    v1::Job job;
    if (!stub.GetJob(&context, request, &job).ok()) {
      ++failures;
      continue;
    }
    if (job.state() != v1::RUNNING) break;
    if (job.progress().step() != last_step) {
      last_step = job.progress().step();
      samples.push_back(job.progress().tokens_per_second());
    }
  }
  return samples;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Load on megatraind while a job runs.\n"
      "Example: daemon_load --socket=/run/megatrain/megatraind.sock --job_id=job-000001");
  absl::ParseCommandLine(argc, argv);
  const std::string id = absl::GetFlag(FLAGS_job_id);
  auto channel = [] {
    return grpc::CreateChannel("unix:" + absl::GetFlag(FLAGS_socket),
                               grpc::InsecureChannelCredentials());
  };
  auto stub = v1::Trainer::NewStub(channel());
  std::atomic<long> failures{0}, calls{0}, events{0};
  const int seconds = absl::GetFlag(FLAGS_seconds);

  const double daemon_cpu_0 = ProcessCpuSeconds(absl::GetFlag(FLAGS_daemon_pid));
  const auto wall_0 = Clock::now();
  std::vector<double> quiet = Sample(*stub, id, seconds, failures);
  const double daemon_cpu_1 = ProcessCpuSeconds(absl::GetFlag(FLAGS_daemon_pid));
  const double self_cpu_1 = SelfCpuSeconds();
  const auto wall_1 = Clock::now();
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int p = 0; p < absl::GetFlag(FLAGS_pollers); ++p) {
    threads.emplace_back([&, p] {
      auto client = v1::Trainer::NewStub(channel());  // one connection per client
      const auto period = std::chrono::microseconds(1'000'000 / absl::GetFlag(FLAGS_poll_hz));
      for (auto next = Clock::now(); !stop; next += period) {
        std::this_thread::sleep_until(next);
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        grpc::Status s;
        if ((p + calls) % 2 == 0) {
          v1::GetJobRequest request;
          request.set_id(id);
          v1::Job job;
          s = client->GetJob(&context, request, &job);
        } else {
          v1::ListJobsResponse response;
          s = client->ListJobs(&context, v1::ListJobsRequest(), &response);
        }
        ++calls;
        if (!s.ok()) {
          ++failures;
          std::fprintf(stderr, "rpc failed: %s\n", s.error_message().c_str());
        }
      }
    });
  }
  std::vector<std::unique_ptr<grpc::ClientContext>> watch_contexts;
  for (int w = 0; w < absl::GetFlag(FLAGS_watchers); ++w) {
    watch_contexts.push_back(std::make_unique<grpc::ClientContext>());
    threads.emplace_back([&, context = watch_contexts.back().get()] {
      auto client = v1::Trainer::NewStub(channel());
      v1::WatchJobRequest request;
      request.set_id(id);
      auto reader = client->WatchJob(context, request);
      v1::ProgressEvent event;
      while (reader->Read(&event)) ++events;
      grpc::Status s = reader->Finish();
      if (!stop && !s.ok()) ++failures;
    });
  }
  std::vector<double> loaded = Sample(*stub, id, seconds, failures);
  const double daemon_cpu_2 = ProcessCpuSeconds(absl::GetFlag(FLAGS_daemon_pid));
  const double self_cpu_2 = SelfCpuSeconds();
  const auto wall_2 = Clock::now();
  stop = true;
  for (auto& c : watch_contexts) c->TryCancel();
  for (std::thread& t : threads) t.join();

  const double q = Median(quiet), l = Median(loaded);
  const double drop = q > 0 ? (q - l) / q : 1;
  std::printf(
      "quiet: %.0f tokens/s (median of %zu steps); loaded: %.0f tokens/s (median of %zu steps); "
      "drop %.2f%%; %ld unary calls, %ld watch events, %ld failed RPCs\n",
      q, quiet.size(), l, loaded.size(), drop * 100, calls.load(), events.load(), failures.load());
  // Where the CPU went: on a machine with few cores the load generator (this
  // process) competes with training for the same cores.
  const double quiet_wall = std::chrono::duration<double>(wall_1 - wall_0).count();
  const double loaded_wall = std::chrono::duration<double>(wall_2 - wall_1).count();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf(
      "load generator (this process): %.1f CPU-s in the %.0f s loaded phase = %.1f%% of %u "
      "cores\n",
      self_cpu_2 - self_cpu_1, loaded_wall, 100 * (self_cpu_2 - self_cpu_1) / (loaded_wall * cores),
      cores);
  if (absl::GetFlag(FLAGS_daemon_pid) > 0) {
    std::printf("megatraind: %.1f CPU-s quiet (%.0f s), %.1f CPU-s loaded (%.0f s)\n",
                daemon_cpu_1 - daemon_cpu_0, quiet_wall, daemon_cpu_2 - daemon_cpu_1, loaded_wall);
  }
  return failures == 0 && drop < absl::GetFlag(FLAGS_max_drop) && !loaded.empty() ? 0 : 1;
}
