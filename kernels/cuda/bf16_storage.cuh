// Kept for the .cu files that include it (attention.cu): the policy lives in
// bf16_storage.h, which the host compiler can build too (bf16_storage_test).
#pragma once

#include "kernels/cuda/bf16_storage.h"
