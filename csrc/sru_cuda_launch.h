// The CUDA runtime for sru_cuda_kernels.cu: the real one under nvcc, the serial CPU
// emulation of sru_cuda_emulation.h when the same source is compiled as C++ for the tests.
// Kernels are launched through SRU_LAUNCH_KERNEL so both builds share one source.
#pragma once

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define SRU_LAUNCH_KERNEL(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#elif defined(SRU_CUDA_EMULATION)
#include "sru_cuda_emulation.h"
#else
#error "sru_cuda_kernels.cu needs nvcc, or -DSRU_CUDA_EMULATION for the CPU emulation"
#endif
