// Kept for the .cu files that include it (attention.cu): the reductions live
// in block_reduce.h, compiled by nvcc and by the host block emulator alike.
#pragma once

#include "kernels/cuda/block_reduce.h"
