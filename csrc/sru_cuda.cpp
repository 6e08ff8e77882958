// CUDA binding of the recurrence (built only with a CUDA build of torch): the generic binding
// of sru_cuda_binding.h entered through CUDAGuard on the current CUDA stream, and the
// launchers of sru_cuda_kernels.cu.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "sru_cuda_binding.h"

namespace sru_lightning {

namespace {

struct CudaDevice {
  using Guard = c10::cuda::CUDAGuard;
  static cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
  static void check(cudaError_t error) { C10_CUDA_CHECK(error); }
};

using CudaBinding = CudaRecurrenceBinding<CudaDevice>;

}  // namespace

}  // namespace sru_lightning

TORCH_LIBRARY_IMPL(sru_lightning, CUDA, m) {
  m.impl("recurrence_forward", torch::CppFunction::makeFromBoxedFunction<&sru_lightning::CudaBinding::forward>());
  m.impl("recurrence_backward", torch::CppFunction::makeFromBoxedFunction<&sru_lightning::CudaBinding::backward>());
}
