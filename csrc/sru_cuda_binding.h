// Tensor binding of the CUDA kernels, generic over how a device is entered: the real CUDA
// binding (sru_cuda.cpp: CUDAGuard, the current CUDA stream, C10_CUDA_CHECK) and the CPU
// emulation of the kernels (sru_cuda_emulated.cpp) share every line of it.
//
// The includer provides cudaError_t and cudaStream_t first: the CUDA runtime, or
// sru_cuda_emulation.h.
#pragma once

#include <tuple>

#include "sru_ops.h"

namespace sru_lightning {

// The launchers of sru_cuda_kernels.cu.
template <typename T>
cudaError_t launch_forward(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& args,
                           cudaStream_t stream);
template <typename T>
cudaError_t launch_backward(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& args,
                            cudaStream_t stream);

// Boxed kernels of the two ops (registered with torch::CppFunction::makeFromBoxedFunction).
// Device supplies: `Guard` (constructed from U's device, it makes that device current for
// the call), `static cudaStream_t current_stream()` (asked after the guard is in place) and
// `static void check(cudaError_t)` (raises on a failed launch).
template <typename Device>
struct CudaRecurrenceBinding {
  static void forward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    run_boxed(op, stack, [](const CallArguments& call) {
      const typename Device::Guard device_guard(call["U"].toTensor().device());
      const cudaStream_t stream = Device::current_stream();
      return recurrence_forward_impl(call, [stream](const RecurrenceDims& dims, const auto& args) {
        Device::check(launch_forward(dims, args, stream));
      });
    });
  }

  static void backward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    run_boxed(op, stack, [](const CallArguments& call) {
      const typename Device::Guard device_guard(call["U"].toTensor().device());
      const cudaStream_t stream = Device::current_stream();
      return recurrence_backward_impl(call, [stream](const RecurrenceDims& dims, const auto& args) {
        Device::check(launch_backward(dims, args, stream));
      });
    });
  }
};

}  // namespace sru_lightning
