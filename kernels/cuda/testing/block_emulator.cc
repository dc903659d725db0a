// The block emulator: one fiber (ucontext) per thread of a block, all on the
// calling thread, a checking barrier for __syncthreads and shuffles, blocks in
// order.
#include "kernels/cuda/testing/block_emulator.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace megatrain::kernels::cuda::testing {
namespace {

// What a thread is waiting at; two threads meeting at different ones is the
// bug the emulator exists to catch.
enum class BarrierKind { kBlockStart, kSyncThreads, kShuffle, kBlockEnd };

const char* KindName(BarrierKind kind) {
  switch (kind) {
    case BarrierKind::kBlockStart:
      return "block start";
    case BarrierKind::kSyncThreads:
      return "__syncthreads";
    case BarrierKind::kShuffle:
      return "a warp shuffle";
    case BarrierKind::kBlockEnd:
      return "the end of the body";
  }
  return "?";
}

struct Arrival {
  BarrierKind kind = BarrierKind::kBlockStart;
  int64_t sequence = 0;  // barriers this thread passed in this block
  bool operator==(const Arrival&) const = default;
};

// Thrown out of a barrier once the run failed, to unwind every thread.
struct RunAborted {};

// State shared by the threads of one launch. Each emulated thread is a fiber
// with its own stack, and a barrier is a switch back to the scheduler
// (RunFibers): it resumes the fibers in thread order (in reverse in every
// other block), and once every one has arrived again it compares what each
// arrived at. Two switches per thread and
// barrier, where a std::thread per emulated thread cost a futex wake-up of
// every thread per barrier (a hundred times slower on a few cores). Every
// failure goes through a barrier, so all threads of the block see it at once
// and unwind together.
class LaunchState {
 public:
  explicit LaunchState(const EmulatedGrid& grid)
      : grid_(grid),
        shared_(grid.shared_bytes),
        exchange_(2 * static_cast<size_t>(grid.threads)),
        arrivals_(static_cast<size_t>(grid.threads)),
        problems_(static_cast<size_t>(grid.threads)),
        fibers_(static_cast<size_t>(grid.threads)) {}

  const EmulatedGrid& grid() const { return grid_; }
  void* shared() { return shared_.data(); }
  // Two exchange arrays, used by alternate shuffles: a thread writing one
  // cannot disturb a later thread still to read the other, and reusing one
  // needs the barrier of the shuffle in between, which every reader passed.
  uint32_t* exchange(int64_t shuffle) {
    return exchange_.data() + (shuffle % 2) * static_cast<size_t>(grid_.threads);
  }

  // Returns once all threads arrived; throws RunAborted (in every thread) if
  // they arrived at different barriers or any reported a problem.
  void Wait(int thread, Arrival arrival, int64_t block_x, int64_t block_y,
            std::string problem = "") {
    arrivals_[static_cast<size_t>(thread)] = arrival;
    problems_[static_cast<size_t>(thread)] = std::move(problem);
    block_x_ = block_x;  // the same value from every thread of the block
    block_y_ = block_y;
    swapcontext(&fibers_[static_cast<size_t>(thread)].context, &scheduler_);
    if (failed_) throw RunAborted{};
  }

  // Runs `thread_main(thread)` as one fiber per thread until all return.
  void RunFibers(std::function<void(int)> thread_main) {
    thread_main_ = std::move(thread_main);
    for (int t = 0; t < grid_.threads; ++t) {
      Fiber& fiber = fibers_[static_cast<size_t>(t)];
      // Default-initialised: the pages are only touched as the stack grows.
      fiber.stack.reset(new char[kStackBytes]);
      getcontext(&fiber.context);
      fiber.context.uc_stack.ss_sp = fiber.stack.get();
      fiber.context.uc_stack.ss_size = kStackBytes;
      fiber.context.uc_link = &scheduler_;  // where a fiber goes when thread_main returns
      makecontext(&fiber.context, &FiberEntry, 0);
    }
    bool descending = false;  // this block's order (see the header)
    int64_t blocks_started = 0;
    for (;;) {
      int finished = 0;
      for (int i = 0; i < grid_.threads; ++i) {
        const int t = descending ? grid_.threads - 1 - i : i;
        Fiber& fiber = fibers_[static_cast<size_t>(t)];
        if (fiber.finished) {
          ++finished;
          continue;
        }
        starting_launch = this;
        starting_thread = t;
        swapcontext(&scheduler_, &fiber.context);
        if (fiber.finished) ++finished;
      }
      if (finished == grid_.threads) return;
      // The threads leave together (after the last block's end, or unwinding
      // from a failure), so a round where only some finished cannot happen.
      if (finished != 0) {
        std::fprintf(stderr, "block_emulator: %d of %d threads finished early\n", finished,
                     grid_.threads);
        std::abort();
      }
      Check();
      if (arrivals_[0].kind == BarrierKind::kBlockStart) descending = blocks_started++ % 2 == 1;
    }
  }

  std::string error() const { return error_; }

 private:
  static constexpr size_t kStackBytes = 512 * 1024;

  struct Fiber {
    ucontext_t context;
    std::unique_ptr<char[]> stack;
    bool finished = false;
  };

  // Which fiber FiberEntry starts (makecontext passes no pointer portably);
  // read before the fiber first yields.
  static thread_local LaunchState* starting_launch;
  static thread_local int starting_thread;

  static void FiberEntry() {
    LaunchState* launch = starting_launch;
    const int thread = starting_thread;
    launch->thread_main_(thread);
    launch->fibers_[static_cast<size_t>(thread)].finished = true;
  }  // returns to uc_link: the scheduler

  void Check() {
    const std::string where = absl::StrCat("block (", block_x_, ", ", block_y_, "): ");
    for (int t = 0; t < grid_.threads && error_.empty(); ++t) {
      if (!problems_[static_cast<size_t>(t)].empty()) {
        error_ = absl::StrCat(where, "thread ", t, ": ", problems_[static_cast<size_t>(t)]);
      } else if (!(arrivals_[static_cast<size_t>(t)] == arrivals_[0])) {
        error_ = absl::StrCat(where, "thread 0 reached ", KindName(arrivals_[0].kind),
                              " as its barrier #", arrivals_[0].sequence, " but thread ", t,
                              " reached ", KindName(arrivals_[static_cast<size_t>(t)].kind),
                              " as its barrier #", arrivals_[static_cast<size_t>(t)].sequence);
      }
    }
    if (!error_.empty()) failed_ = true;
  }

  const EmulatedGrid grid_;
  std::vector<unsigned char> shared_;
  std::vector<uint32_t> exchange_;
  std::vector<Arrival> arrivals_;      // written by each thread before it arrives
  std::vector<std::string> problems_;  // likewise
  std::vector<Fiber> fibers_;
  ucontext_t scheduler_;
  std::function<void(int)> thread_main_;
  int64_t block_x_ = 0, block_y_ = 0;
  std::string error_;
  bool failed_ = false;
};

thread_local LaunchState* LaunchState::starting_launch = nullptr;
thread_local int LaunchState::starting_thread = 0;

struct ThreadContext {
  LaunchState* launch = nullptr;
  EmulatedThread position;
  int64_t barriers_passed = 0;
  int64_t shuffles = 0;  // picks the exchange array (see LaunchState::exchange)
};

// The calling thread's emulated builtins (see the header for why thread_local).
thread_local ThreadContext* current = nullptr;

ThreadContext& Current() {
  if (current == nullptr) {
    std::fprintf(stderr, "block_emulator: a CUDA builtin was used outside RunEmulatedGrid\n");
    std::abort();
  }
  return *current;
}

void Barrier(ThreadContext& ctx, BarrierKind kind, std::string problem = "") {
  ctx.launch->Wait(ctx.position.thread, Arrival{kind, ctx.barriers_passed}, ctx.position.block_x,
                   ctx.position.block_y, std::move(problem));
  current = &ctx;  // other fibers ran meanwhile
  ++ctx.barriers_passed;
}

uint32_t Bits(float v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

float FromBits(uint32_t b) {
  float v = 0.0f;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

constexpr int kWarpSize = 32;

// One shuffle: every thread publishes its value, then reads its source lane's
// (source_lane(lane) outside [0, 32) reads its own value, as in CUDA).
template <class SourceLane>
float Shuffle(unsigned mask, float value, SourceLane source_lane) {
  ThreadContext& ctx = Current();
  if (mask != 0xffffffffu || ctx.position.threads % kWarpSize != 0) {
    Barrier(ctx, BarrierKind::kShuffle,
            absl::StrCat("shuffle with mask ", mask, " in a block of ", ctx.position.threads,
                         " threads: the emulator needs whole warps and the full mask"));
  }
  uint32_t* slots = ctx.launch->exchange(ctx.shuffles++);
  const int thread = ctx.position.thread;
  slots[thread] = Bits(value);
  Barrier(ctx, BarrierKind::kShuffle);
  const int lane = thread % kWarpSize;
  const int source = source_lane(lane);
  return (source >= 0 && source < kWarpSize) ? FromBits(slots[thread - lane + source]) : value;
}

void RunThread(LaunchState* launch, int thread,
               const std::function<void(const EmulatedThread&)>* body) {
  ThreadContext ctx;
  ctx.launch = launch;
  ctx.position.thread = thread;
  ctx.position.threads = launch->grid().threads;
  ctx.position.shared = launch->shared();
  current = &ctx;
  try {
    for (int64_t by = 0; by < launch->grid().blocks_y; ++by) {
      for (int64_t bx = 0; bx < launch->grid().blocks_x; ++bx) {
        ctx.position.block_x = bx;
        ctx.position.block_y = by;
        ctx.barriers_passed = 0;
        ctx.shuffles = 0;
        // Thread 0 poisons shared memory while the others wait, so a read of
        // a slot no thread of this block wrote shows up as NaN.
        if (thread == 0 && launch->grid().shared_bytes > 0) {
          std::memset(launch->shared(), 0xff, launch->grid().shared_bytes);
        }
        Barrier(ctx, BarrierKind::kBlockStart);
        (*body)(ctx.position);
        Barrier(ctx, BarrierKind::kBlockEnd);
      }
    }
  } catch (const RunAborted&) {
    // The failure is recorded in launch; every thread unwinds here.
  }
  current = nullptr;
}

}  // namespace

absl::Status RunEmulatedGrid(const EmulatedGrid& grid,
                             const std::function<void(const EmulatedThread&)>& body) {
  if (grid.threads <= 0 || grid.threads > 1024 || grid.blocks_x < 0 || grid.blocks_y < 0) {
    return absl::InvalidArgumentError(absl::StrCat("EmulatedGrid: blocks (", grid.blocks_x, ", ",
                                                   grid.blocks_y, ") of ", grid.threads,
                                                   " threads is not a CUDA launch"));
  }
  LaunchState launch(grid);
  launch.RunFibers([&](int thread) { RunThread(&launch, thread, &body); });
  const std::string error = launch.error();
  if (!error.empty()) return absl::FailedPreconditionError(error);
  return absl::OkStatus();
}

unsigned EmulatedThreadX() { return static_cast<unsigned>(Current().position.thread); }
unsigned EmulatedBlockDimX() { return static_cast<unsigned>(Current().position.threads); }
int64_t EmulatedBlockX() { return Current().position.block_x; }
int64_t EmulatedBlockY() { return Current().position.block_y; }

void EmulatedSyncThreads() { Barrier(Current(), BarrierKind::kSyncThreads); }

float EmulatedShflXor(unsigned mask, float value, int lane_mask) {
  return Shuffle(mask, value, [lane_mask](int lane) { return lane ^ lane_mask; });
}

float EmulatedShflDown(unsigned mask, float value, int delta) {
  return Shuffle(mask, value, [delta](int lane) { return lane + delta; });
}

}  // namespace megatrain::kernels::cuda::testing
