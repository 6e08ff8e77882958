// The CUDA kernels of sru_cuda_kernels.cu, compiled as C++ (-DSRU_CUDA_EMULATION) and run
// serially on the CPU, bound to CPU tensors through the same binding as the real CUDA
// kernels (sru_cuda_binding.h) as the ops torch.ops.sru_lightning_cuda_emulated.*. Only the
// tests and diagnostics load it (sru_lightning/diagnostics/cuda_emulation.py): it checks
// the indexing and the math of the GPU source on machines without a GPU.
#include <torch/library.h>

#include "sru_cuda_emulation.h"
#include "sru_cuda_binding.h"

namespace sru_lightning {

namespace {

struct EmulatedDevice {
  // One device, the CPU: nothing to switch to, but only CPU tensors can be read.
  struct Guard {
    explicit Guard(const c10::Device& device) {
      TORCH_CHECK_VALUE(device.is_cpu(), "sru_lightning_cuda_emulated: the emulated CUDA kernels run on CPU "
                        "tensors, got a tensor on ", device);
    }
  };
  static cudaStream_t current_stream() { return nullptr; }
  static void check(cudaError_t error) {
    TORCH_CHECK(error == cudaSuccess, "sru_lightning_cuda_emulated: kernel launch failed: ",
                cudaGetErrorString(error));
  }
};

using EmulatedBinding = CudaRecurrenceBinding<EmulatedDevice>;

}  // namespace

}  // namespace sru_lightning

TORCH_LIBRARY(sru_lightning_cuda_emulated, m) {
  m.def(sru_lightning::kRecurrenceForwardSchema);
  m.def(sru_lightning::kRecurrenceBackwardSchema);
}

TORCH_LIBRARY_IMPL(sru_lightning_cuda_emulated, CPU, m) {
  m.impl("recurrence_forward", torch::CppFunction::makeFromBoxedFunction<&sru_lightning::EmulatedBinding::forward>());
  m.impl("recurrence_backward", torch::CppFunction::makeFromBoxedFunction<&sru_lightning::EmulatedBinding::backward>());
}
