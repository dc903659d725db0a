// adamw_capi: a C ABI over HostAdamw and the store's array allocation, so that
// bench/peer_adamw.py can run our optimizer in the peers' own process and time
// both sides alternately under the same machine state (libmegatrain_adamw.so).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/types/span.h"
#include "engine/common/huge_pages.h"
#include "engine/common/thread_pool.h"
#include "engine/optimizer/host_adamw.h"
#include "kernels/common/adamw.h"

namespace {

struct Optimizer {
  explicit Optimizer(int threads) : pool(static_cast<size_t>(threads)), adamw(&pool) {}
  megatrain::engine::ThreadPool pool;
  megatrain::engine::HostAdamw adamw;
};

}  // namespace

extern "C" {

// A HostAdamw on a pool of `threads` workers (>= 1), as the trainer builds it.
void* megatrain_adamw_create(int threads) {
  if (threads < 1) return nullptr;
  return new Optimizer(threads);
}

void megatrain_adamw_destroy(void* optimizer) { delete static_cast<Optimizer*>(optimizer); }

// An array allocated the way ParameterStore allocates its pageable arrays
// (huge-page aligned and advised from 8 MiB on). Untouched: the caller's fill
// is the first touch. Free with megatrain_adamw_free; nullptr when out of memory.
void* megatrain_adamw_alloc(size_t bytes) {
  return megatrain::engine::AllocateStreamingArray(bytes, 64);
}

void megatrain_adamw_free(void* data) { std::free(data); }

// One AdamW step (kernels::AdamwUpdate) over n elements: [0, n - undecayed_tail)
// with weight_decay, the last undecayed_tail without (a norm's weights), as in
// peer_adamw.py's two parameter groups. compute_copy_bf16 may be null; when
// set it receives the bf16 rounding of every new parameter in the same pass.
// Returns 0, or -1 when undecayed_tail > n.
int megatrain_adamw_step(void* optimizer, long long step, double lr, double beta1, double beta2,
                         double eps, double weight_decay, size_t n, size_t undecayed_tail,
                         float* param, float* m, float* v, const float* grad,
                         uint16_t* compute_copy_bf16) {
  if (undecayed_tail > n) return -1;
  using megatrain::kernels::MakeAdamwStepScalars;
  const auto decay = MakeAdamwStepScalars(lr, beta1, beta2, eps, weight_decay, step, 1.0);
  const auto no_decay = MakeAdamwStepScalars(lr, beta1, beta2, eps, 0.0, step, 1.0);
  const megatrain::engine::AdamwSegment segments[2] = {{0, n - undecayed_tail, true},
                                                       {n - undecayed_tail, undecayed_tail, false}};
  static_cast<Optimizer*>(optimizer)->adamw.Step(decay, no_decay, absl::MakeConstSpan(segments),
                                                 param, m, v, grad, compute_copy_bf16);
  return 0;
}

}  // extern "C"
