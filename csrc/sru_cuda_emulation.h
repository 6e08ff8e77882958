// What sru_cuda_kernels.cu needs from CUDA, for compiling it as plain C++ and running its
// kernels serially on the CPU (the test suite's `cuda_emulation` tier). Under nvcc the .cu
// never includes this header; sru_cuda_launch.h picks it only when __CUDACC__ is absent.
//
// What it models: the launch (a grid of blocks of threads, every thread running the kernel
// to completion, one after another), the built-ins threadIdx / blockIdx / blockDim /
// gridDim, the launch limits of the device (a bad configuration is reported by
// cudaGetLastError like on a GPU), and the device's expf (sru_step.h selects it under
// SRU_CUDA_EMULATION). What it cannot model: concurrency between threads, shared memory and
// __syncthreads (deliberately not defined, so a kernel that starts using them fails to
// build here instead of passing silently), streams and device memory.
#pragma once

#ifndef SRU_CUDA_EMULATION
#error "sru_cuda_emulation.h is only for the emulated build (-DSRU_CUDA_EMULATION)"
#endif

#include <cstdint>
#include <math.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))

namespace sru_lightning {

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned int x_, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

// Built-ins: set by the launch loop before each emulated thread runs.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9 };
using cudaStream_t = struct EmulatedStream*;

namespace emulation {
inline thread_local cudaError_t last_error = cudaSuccess;

// Limits every GPU of compute capability >= 3.0 enforces.
constexpr unsigned int kMaxThreadsPerBlock = 1024;
constexpr unsigned int kMaxGridX = 2147483647u;

// Runs `thread()` once per thread of the grid. Blocks and threads go in reverse order, so a
// kernel that silently relied on thread 0 having run first (a race on a GPU) computes
// something else here.
template <typename Thread>
void launch(dim3 grid, dim3 block, Thread&& thread) {
  if (block.x * block.y * block.z == 0 || block.x * block.y * block.z > kMaxThreadsPerBlock ||
      grid.x == 0 || grid.x > kMaxGridX || grid.y > 65535 || grid.z > 65535) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  gridDim = grid;
  blockDim = block;
  for (unsigned int bz = grid.z; bz-- > 0;)
    for (unsigned int by = grid.y; by-- > 0;)
      for (unsigned int bx = grid.x; bx-- > 0;) {
        blockIdx = dim3(bx, by, bz);
        for (unsigned int tz = block.z; tz-- > 0;)
          for (unsigned int ty = block.y; ty-- > 0;)
            for (unsigned int tx = block.x; tx-- > 0;) {
              threadIdx = dim3(tx, ty, tz);
              thread();
            }
      }
}
}  // namespace emulation

inline cudaError_t cudaGetLastError() {
  const cudaError_t error = emulation::last_error;
  emulation::last_error = cudaSuccess;
  return error;
}

inline const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "invalid configuration argument";
}

}  // namespace sru_lightning

// The stand-in for kernel<<<grid, block, shared_bytes, stream>>>(args...).
#define SRU_LAUNCH_KERNEL(kernel, grid, block, shared_bytes, stream, ...) \
  ::sru_lightning::emulation::launch((grid), (block), [&] { kernel(__VA_ARGS__); })
