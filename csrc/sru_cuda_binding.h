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

// Device supplies: `Guard` (constructed from U's device, it makes that device current for
// the call), `static cudaStream_t current_stream()` (asked after the guard is in place) and
// `static void check(cudaError_t)` (raises on a failed launch).
template <typename Device>
struct CudaRecurrenceBinding {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(
      const at::Tensor& U, const OptionalTensor& x, const at::Tensor& weight_c, const at::Tensor& bias,
      const OptionalTensor& c0, const OptionalTensor& scale_x, double scale_x_value,
      const OptionalTensor& mask_c, const OptionalTensor& mask_pad, bool bidirectional, bool has_skip_term,
      bool store_c) {
    const typename Device::Guard device_guard(U.device());
    const cudaStream_t stream = Device::current_stream();
    return recurrence_forward_impl(U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c, mask_pad,
                                   bidirectional, has_skip_term, store_c,
                                   [stream](const RecurrenceDims& dims, const auto& args) {
                                     Device::check(launch_forward(dims, args, stream));
                                   });
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_h, const OptionalTensor& grad_c_last, const at::Tensor& U,
      const OptionalTensor& x, const at::Tensor& weight_c, const at::Tensor& bias, const OptionalTensor& c0,
      const OptionalTensor& scale_x, double scale_x_value, const OptionalTensor& mask_c,
      const OptionalTensor& mask_pad, const at::Tensor& c_all, bool bidirectional, bool has_skip_term) {
    const typename Device::Guard device_guard(U.device());
    const cudaStream_t stream = Device::current_stream();
    return recurrence_backward_impl(grad_h, grad_c_last, U, x, weight_c, bias, c0, scale_x, scale_x_value,
                                    mask_c, mask_pad, c_all, bidirectional, has_skip_term,
                                    [stream](const RecurrenceDims& dims, const auto& args) {
                                      Device::check(launch_backward(dims, args, stream));
                                    });
  }
};

}  // namespace sru_lightning
