// The memory part of job-spec validation (see memory_spec_validation.h).
#include "service/memory_spec_validation.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/planner/planner.h"
#include "engine/tiers/direct_io_directory.h"
#include "engine/tiers/nvme_tier_files.h"
#include "engine/tiers/placement.h"
#include "service/spec_field_checks.h"

namespace megatrain::service {
namespace {

// The planner's refusal of an executor option names the option ("weight_ring_bytes=..."):
// the job spec's field for it.
std::string ExecutorField(absl::string_view planner_message) {
  for (const char* option : {"weight_ring_bytes", "fragment_bytes", "activation_budget_bytes"}) {
    if (absl::StartsWith(planner_message, absl::StrCat(option, "="))) {
      return absl::StrCat("executor.", option);
    }
  }
  return "hyper";
}

uint64_t PhysicalRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// The host memory a job may plan for: the physical RAM, or the daemon's max_ram_bytes when
// that is set and smaller.
uint64_t MachineRamLimit(const DaemonSettings& settings) {
  const uint64_t physical = PhysicalRamBytes();
  if (settings.max_ram_bytes != 0 && (physical == 0 || settings.max_ram_bytes < physical)) {
    return settings.max_ram_bytes;
  }
  return physical == 0 ? UINT64_MAX : physical;
}

const char* MachineRamLimitName(const DaemonSettings& settings) {
  return settings.max_ram_bytes != 0 && settings.max_ram_bytes == MachineRamLimit(settings)
             ? "the daemon's max_ram_bytes"
             : "physical RAM";
}

// A job on several machines: the most ranks one machine runs (they share its RAM and its NVMe
// directory's drive). The daemon sees only its own machine, so it takes the busiest host of the
// spec (a name given twice runs both counts there); a rank knows its own machine's
// (DaemonSettings::ranks_on_this_machine).
int RanksPerMachine(const ValidatedJob& job, const DaemonSettings& settings) {
  if (settings.ranks_on_this_machine > 0) return settings.ranks_on_this_machine;
  std::map<std::string, int> ranks_of_host;
  for (const RankHost& h : job.hosts) ranks_of_host[h.name] += h.ranks;
  int ranks_per_machine = 1;
  for (const auto& [name, ranks] : ranks_of_host) {
    ranks_per_machine = std::max(ranks_per_machine, ranks);
  }
  return ranks_per_machine;
}

// The daemon's device as the planner sees it: memory figures exact, speeds nominal (the daemon
// does not probe the host, so no step time is predicted). A GPU computes from a bf16 copy with
// bf16 activations; the CPU device in fp32.
engine::planner::HardwareProfile DeviceProfile(const engine::DeviceOptions& device) {
  engine::planner::HardwareProfile hw;
  hw.cpu_device = device.kind == engine::DeviceKind::kCpu;
  hw.name = hw.cpu_device ? "megatraind-cpu-device" : "megatraind-cuda-device";
  hw.device_memory_bytes = device.arena_bytes;
  hw.dense_tflops = 0.1;
  hw.device_memory_gbps = 10;
  hw.h2d_gbps = device.link_gbps;
  hw.d2h_gbps = device.link_gbps;
  hw.link_latency_us = device.link_latency_us;
  hw.memcpy_gbps = 10;
  hw.host_memory_gbps = 10;
  hw.weight_bytes = hw.cpu_device ? 4 : 2;
  hw.activation_bytes = hw.cpu_device ? 4 : 2;
  return hw;
}

}  // namespace

engine::planner::PlanInputs PlanInputsFor(const ValidatedJob& job,
                                          const DaemonSettings& settings) {
  engine::planner::PlanInputs in;
  in.micro_batch = job.options.trainer.micro_batch_size;
  in.seq = job.options.trainer.seq_len;
  // A job on several machines is planned per rank: each runs its share of the accumulation,
  // and under ZeRO-1 holds its share of m and v.
  const int ranks = std::max(1, job.ranks);
  in.grad_accumulation = job.options.grad_accumulation / ranks;
  in.ranks = ranks;
  in.zero1_world = job.options.trainer.zero1 ? ranks : 0;
  in.ranks_per_machine = RanksPerMachine(job, settings);
  in.checkpoint_interval = job.options.trainer.executor.checkpoint_interval;
  in.weight_slots = job.options.trainer.executor.weight_slots;
  in.head_block_rows = job.options.trainer.head_block_rows;
  in.weight_ring_bytes = job.options.trainer.executor.weight_ring_bytes;
  in.fragment_bytes = job.options.trainer.executor.fragment_bytes;
  in.activation_budget_bytes = job.options.trainer.executor.activation_budget_bytes;
  in.activation_policy = job.options.trainer.executor.activation_policy;
  in.device_arena_bytes = job.options.device.arena_bytes;
  in.devices = std::max(1, job.options.devices);
  in.fixed_overhead_bytes = 0;
  const engine::HostMemoryBudgets& budgets = job.options.trainer.memory;
  in.budgets_enabled = budgets.enabled;
  in.budgets = budgets.budgets;
  in.states_on_nvme = budgets.states_on_nvme;
  in.master_on_nvme = budgets.master_on_nvme;
  in.grad_on_nvme = budgets.grad_on_nvme;
  in.compute_copy_on_nvme = budgets.compute_copy_on_nvme;
  in.nvme_chunk_bytes = budgets.nvme_chunk_bytes;
  in.speculative_update = job.options.trainer.speculative_update;
  in.grad_clip = job.options.trainer.grad_clip;
  in.previous_norm_clip = job.options.trainer.grad_clip_rule == engine::GradClipRule::kPreviousNorm;
  in.steps = job.options.steps;
  in.drive_wear = settings.drive_wear;
  return in;
}

namespace {

// Exact placement and device plan from the engine's planner; refuses plans that do not fit.
absl::Status PlanWithEngine(const v1::MemoryBudgets& m, const DaemonSettings& settings,
                            ValidatedJob& job) {
  const engine::planner::PlanInputs in = PlanInputsFor(job, settings);
  // A ring or an activation budget alone beyond the arena: name that field.
  for (const auto& [field, bytes] :
       {std::pair<const char*, uint64_t>{"executor.weight_ring_bytes", in.weight_ring_bytes},
        std::pair<const char*, uint64_t>{"executor.activation_budget_bytes",
                                         in.activation_budget_bytes}}) {
    if (bytes > job.options.device.arena_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(field, ": ", bytes,
                                                       " exceed the device arena of ",
                                                       job.options.device.arena_bytes, " bytes"));
    }
  }
  absl::StatusOr<engine::planner::PlanResult> plan =
      engine::planner::Plan(job.model, in, DeviceProfile(job.options.device));
  if (!plan.ok()) {
    if (plan.status().code() == absl::StatusCode::kResourceExhausted) {
      // The placement's refusal says which tier lacks how much; name that budget's field.
      const absl::string_view message = plan.status().message();
      const char* field = absl::StrContains(message, "of NVMe")  ? "memory.nvme_bytes"
                          : absl::StrContains(message, "of RAM") ? "memory.ram_bytes"
                                                                 : "memory";
      return absl::ResourceExhaustedError(absl::StrCat(field, ": ", message));
    }
    return Invalid(ExecutorField(plan.status().message()), plan.status().message());
  }
  // Never past the machine (issue 16, point 6): whatever the budgets say, the host bytes of the
  // plan (pinned + RAM + staging) must fit the physical RAM, or the daemon's max_ram_bytes.
  // Every device's executor has its own pinned staging beside the one store.
  const uint64_t staging = plan->pinned_reserved;
  const uint64_t host_need = plan->placement.pinned_used + plan->placement.ram_used + staging;
  // A job on several machines: the plan is one rank's; the machine with the most ranks holds
  // that many.
  const int ranks_per_machine = in.ranks_per_machine;
  const uint64_t machine_need = host_need * static_cast<uint64_t>(ranks_per_machine);
  if (!settings.plan_for_other_machine && machine_need > MachineRamLimit(settings)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory: the plan needs ", host_need, " bytes of host memory (pinned ",
        plan->placement.pinned_used, ", RAM ", plan->placement.ram_used + staging, ")",
        ranks_per_machine > 1 ? absl::StrCat(" per rank, ", machine_need, " for the ",
                                             ranks_per_machine, " ranks of one machine")
                              : std::string(),
        "; this machine allows ", MachineRamLimit(settings), " (", MachineRamLimitName(settings),
        "); put buffers on NVMe (memory.nvme_dir)",
        job.ranks > 1 && !job.options.trainer.zero1 ? ", shard the optimizer state (zero1)" : "",
        " or use a smaller model or batch"));
  }
  if (!plan->fits_device && !settings.plan_for_other_machine) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory.device_arena_bytes: the executor's device plan peaks at ",
                     plan->device_arena_peak, " bytes; the arena has ",
                     job.options.device.arena_bytes, " (", plan->device.Describe(), ")"));
  }
  const engine::tiers::Placement& placement = plan->placement;
  // The speculative update: the engine's placement says whether it can run
  // (tiers::ReserveAlternateStateRegions: the master, m and v all on NVMe, all in RAM, or the
  // master in RAM with m and v on NVMe); where the Trainer would quietly leave it off, the daemon
  // refuses the job, naming the field the user set and the one to change.
  if (in.speculative_update && placement.alternate_state_bytes == 0 &&
      placement.alternate_ram_bytes == 0) {
    const bool on_nvme = engine::tiers::MasterAndStatesOnNvme(placement);
    const bool in_ram = engine::tiers::MasterAndStatesInRam(placement);
    const bool mixed = engine::tiers::MasterInRamStatesOnNvme(placement);
    const std::string why = absl::StrCat(
        "true, but the placement says \"", placement.speculation_note, "\"",
        on_nvme  ? "; raise memory.nvme_bytes"
        : in_ram ? "; raise memory.ram_bytes (and memory.pinned_ram_bytes where the master is "
                   "pinned)"
        : mixed  ? "; raise memory.nvme_bytes for the m/v regions, memory.ram_bytes (or "
                   "memory.pinned_ram_bytes where the master is pinned) for the master array, as "
                   "the note says, or put the master on NVMe too (memory.master_on_nvme)"
                 : "; the master, m and v must be all in RAM (give memory.ram_bytes room for them "
                   "twice, without memory.states_on_nvme), all on NVMe (memory.nvme_dir and "
                   "memory.master_on_nvme), or the master in RAM with m and v on NVMe");
    if (on_nvme || in_ram || mixed) {
      return absl::ResourceExhaustedError(absl::StrCat("speculative_update: ", why));
    }
    return Invalid("speculative_update", why);
  }
  // The executor's pinned staging (host activation checkpoints the arena cannot hold included)
  // is allocated from the same pinned budget as the store's pinned buffers.
  // The placement set it aside first (the store's pinned buffers yield to it), so this refuses
  // only staging beyond the whole budget.
  if (!settings.plan_for_other_machine &&
      placement.pinned_used + staging > job.options.device.pinned_budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory.pinned_ram_bytes: the plan needs ", placement.pinned_used + staging,
                     " pinned bytes (master, gradients ", placement.pinned_used,
                     "; executor staging and host activation checkpoints ", staging,
                     "); the budget is ", job.options.device.pinned_budget_bytes));
  }
  const uint64_t ram_need = placement.ram_used + staging;
  // With the NVMe tier the placement above already fitted the store into ram_bytes.
  if (m.ram_bytes() != 0 && m.nvme_dir().empty() && ram_need > m.ram_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat("memory.ram_bytes: the plan needs ", ram_need,
                                                     " bytes of RAM; the budget is ",
                                                     m.ram_bytes()));
  }
  for (int k = 0; k < engine::tiers::kNumBufferKinds; ++k) {
    const engine::tiers::KindPlacement& kind = placement.kinds[k];
    if (kind.tier == engine::tiers::Tier::kAbsent) continue;
    v1::BufferPlacement* p = job.plan.add_placements();
    p->set_kind(engine::tiers::BufferKindName(static_cast<engine::tiers::BufferKind>(k)));
    p->set_tier(engine::tiers::TierName(kind.tier));
    p->set_bytes(kind.bytes);
  }
  auto add_tier = [&](const char* tier, uint64_t bytes, uint64_t budget) {
    v1::TierUsage* t = job.plan.add_tiers();
    t->set_tier(tier);
    t->set_bytes(bytes);
    t->set_budget_bytes(budget);
  };
  add_tier("device", plan->device_arena_peak, job.options.device.arena_bytes);
  add_tier("pinned", placement.pinned_used, job.options.device.pinned_budget_bytes);
  add_tier("ram", ram_need, m.ram_bytes());
  if (placement.any_on_nvme() || !m.nvme_dir().empty()) {
    add_tier("nvme", placement.nvme_used, m.nvme_bytes());
  }
  job.plan.set_device_arena_peak_bytes(plan->device_arena_peak);
  job.plan.set_ranks(static_cast<uint32_t>(std::max(1, job.ranks)));
  job.plan.set_zero1(job.options.trainer.zero1);
  job.plan.set_ranks_per_machine(static_cast<uint32_t>(in.ranks_per_machine));
  job.plan.set_parameters(static_cast<uint64_t>(plan->parameters));
  if (in.speculative_update) job.plan.set_speculative_update(placement.speculation_note);
  // NVMe traffic (exact) and drive wear over the run (the daemon predicts no step time, so the
  // run is judged by hyper.steps x bytes written per step).
  job.plan.set_nvme_read_bytes_per_step(plan->nvme_traffic.read_bytes);
  job.plan.set_nvme_written_bytes_per_step(plan->nvme_traffic.written_bytes);
  job.plan.set_nvme_written_bytes_per_run(plan->drive_wear.written_per_run);
  if (!plan->drive_wear.warning.empty()) job.plan.add_warnings(plan->drive_wear.warning);
  return absl::OkStatus();
}

// The bytes a previous run's tier files hold where this job's stores will put theirs: a run
// removes them before it reserves its own (engine::tiers::RemoveTierFiles), so that space is the
// job's. One process uses nvme_dir itself; a rank counts its own rank-N directory. The daemon
// does not know which `sharers` of a job's ranks mpirun puts on this machine: whichever they are,
// they free at least the `sharers` smallest of the job's rank directories, each counted up to
// nvme_bytes (what one rank may need beyond the free space).
uint64_t ReplaceableTierBytes(const std::string& dir, const ValidatedJob& job,
                              const DaemonSettings& settings, uint64_t nvme_bytes, int sharers) {
  using engine::tiers::RankTierDirectory;
  using engine::tiers::ReplaceableTierFileBytes;
  if (settings.rank >= 0) return ReplaceableTierFileBytes(RankTierDirectory(dir, settings.rank));
  if (job.hosts.empty()) return ReplaceableTierFileBytes(dir);
  std::vector<uint64_t> held;
  for (int r = 0; r < job.ranks; ++r) {
    held.push_back(std::min(ReplaceableTierFileBytes(RankTierDirectory(dir, r)), nvme_bytes));
  }
  std::sort(held.begin(), held.end());
  held.resize(std::min(held.size(), static_cast<size_t>(std::max(0, sharers))));
  uint64_t total = 0;
  for (uint64_t bytes : held) total += bytes;
  return total;
}

// The NVMe tier's directory: under an output root (the daemon writes state files there), on a
// block-backed filesystem that does O_DIRECT (the engine's check), with nvme_bytes free (a
// previous run's tier files there count as free: this job replaces them). The ranks of one
// machine each use up to nvme_bytes in their own directory under nvme_dir, on the same
// filesystem: all of it must be free. A rank re-validates on its machine while its neighbours
// may already have reserved their state files there, so it checks its own share only.
absl::Status ValidateNvme(const v1::MemoryBudgets& m, const PathPolicy& paths,
                          const ValidatedJob& job, const DaemonSettings& settings,
                          engine::tiers::TierBudgets& budgets) {
  if (m.nvme_dir().empty()) {
    if (m.nvme_bytes() != 0) {
      return Invalid("memory.nvme_bytes", absl::StrCat(m.nvme_bytes(), " without memory.nvme_dir"));
    }
    if (m.states_on_nvme()) return Invalid("memory.states_on_nvme", "needs memory.nvme_dir");
    if (m.master_on_nvme()) return Invalid("memory.master_on_nvme", "needs memory.nvme_dir");
    if (m.grad_on_nvme()) return Invalid("memory.grad_on_nvme", "needs memory.nvme_dir");
    if (m.compute_copy_on_nvme()) {
      return Invalid("memory.compute_copy_on_nvme", "needs memory.nvme_dir");
    }
    return absl::OkStatus();
  }
  if (m.nvme_bytes() == 0) {
    return Invalid("memory.nvme_bytes", "0 with memory.nvme_dir set: give the tier a size");
  }
  absl::StatusOr<std::string> dir = paths.ResolveOutput("memory.nvme_dir", m.nvme_dir());
  if (!dir.ok()) return dir.status();
  std::error_code ec;
  if (!std::filesystem::is_directory(*dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("memory.nvme_dir: '", *dir, "' is not an existing directory"));
  }
  if (absl::Status s = engine::tiers::CheckDirectIoDirectory(*dir); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("memory.nvme_dir: ", s.message()));
  }
  struct statvfs fs;
  if (statvfs(dir->c_str(), &fs) == 0) {
    // Divided, not multiplied: nvme_bytes has no upper bound of its own.
    const uint64_t ranks = static_cast<uint64_t>(
        settings.ranks_on_this_machine > 0 ? 1 : std::max(1, RanksPerMachine(job, settings)));
    const uint64_t replaceable =
        ReplaceableTierBytes(*dir, job, settings, m.nvme_bytes(), static_cast<int>(ranks));
    const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize + replaceable;
    if (m.nvme_bytes() > free_bytes / ranks) {
      return absl::FailedPreconditionError(absl::StrCat(
          "memory.nvme_bytes: ", m.nvme_bytes(),
          ranks > 1 ? absl::StrCat(" per rank, for the ", ranks, " ranks of one machine,")
                    : std::string(),
          " exceed the ", free_bytes, " bytes free in memory.nvme_dir '", *dir, "'",
          replaceable > 0 ? absl::StrCat(" (", replaceable,
                                         " of them held by a previous run's tier files, which "
                                         "this job replaces)")
                          : std::string()));
    }
  }
  budgets.nvme_dir = *dir;
  budgets.nvme_bytes = m.nvme_bytes();
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateMemory(const v1::MemoryBudgets& m, const DaemonSettings& settings,
                            const PathPolicy& paths, ValidatedJob& job) {
  engine::HostMemoryBudgets& budgets = job.options.trainer.memory;
  if (absl::Status s = ValidateNvme(m, paths, job, settings, budgets.budgets); !s.ok()) return s;
  job.options.device = settings.device;
  if (m.device_arena_bytes() > settings.device.arena_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory.device_arena_bytes: ", m.device_arena_bytes(),
                     " exceed the daemon's device arena of ", settings.device.arena_bytes));
  }
  if (m.device_arena_bytes() != 0) job.options.device.arena_bytes = m.device_arena_bytes();
  if (m.pinned_ram_bytes() > settings.device.pinned_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory.pinned_ram_bytes: ", m.pinned_ram_bytes(), " exceed the daemon's pinned budget of ",
        settings.device.pinned_budget_bytes));
  }
  if (m.pinned_ram_bytes() != 0) job.options.device.pinned_budget_bytes = m.pinned_ram_bytes();
  // A RAM budget or the NVMe tier: the engine places the store's buffers under the budgets
  // (engine/tiers/placement.h); without either, everything in RAM, copy endpoints pinned.
  if (m.ram_bytes() > MachineRamLimit(settings)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory.ram_bytes: ", m.ram_bytes(), " exceed this machine's ",
                     MachineRamLimit(settings), " bytes (", MachineRamLimitName(settings), ")"));
  }
  if (m.ram_bytes() != 0 || !m.nvme_dir().empty()) {
    budgets.enabled = true;
    budgets.budgets.pinned_ram = job.options.device.pinned_budget_bytes;
    // ram_bytes = 0 means "the machine's", never "unlimited".
    budgets.budgets.ram = m.ram_bytes() != 0 ? m.ram_bytes() : MachineRamLimit(settings);
    budgets.states_on_nvme = m.states_on_nvme();
    budgets.master_on_nvme = m.master_on_nvme();
    budgets.grad_on_nvme = m.grad_on_nvme();
    budgets.compute_copy_on_nvme = m.compute_copy_on_nvme();
    if (m.nvme_chunk_bytes() != 0) {
      if (m.nvme_chunk_bytes() % engine::tiers::kNvmeChunkQuantumBytes != 0) {
        return Invalid(
            "memory.nvme_chunk_bytes",
            absl::StrCat(m.nvme_chunk_bytes(), " is not a multiple of 262144 (256 KiB)"));
      }
      budgets.nvme_chunk_bytes = m.nvme_chunk_bytes();
    }
  }
  return PlanWithEngine(m, settings, job);
}

}  // namespace megatrain::service
