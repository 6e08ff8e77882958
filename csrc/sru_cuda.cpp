// CUDA binding of the recurrence (built only with a CUDA build of torch): the shared tensor
// plumbing of sru_ops.h, the current device and stream, and the launchers of
// sru_cuda_kernels.cu.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "sru_ops.h"

namespace sru_lightning {

template <typename T>
cudaError_t launch_forward(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& args,
                           cudaStream_t stream);
template <typename T>
cudaError_t launch_backward(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& args,
                            cudaStream_t stream);

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrence_forward_cuda(
    const at::Tensor& U, const OptionalTensor& x, const at::Tensor& weight_c,
    const at::Tensor& bias, const OptionalTensor& c0, const OptionalTensor& scale_x,
    double scale_x_value, const OptionalTensor& mask_c, const OptionalTensor& mask_pad,
    bool bidirectional, bool has_skip_term, bool store_c) {
  const c10::cuda::CUDAGuard device_guard(U.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  return recurrence_forward_impl(U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c, mask_pad,
                                 bidirectional, has_skip_term, store_c,
                                 [stream](const RecurrenceDims& dims, const auto& args) {
                                   C10_CUDA_CHECK(launch_forward(dims, args, stream));
                                 });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> recurrence_backward_cuda(
    const at::Tensor& grad_h, const OptionalTensor& grad_c_last, const at::Tensor& U,
    const OptionalTensor& x, const at::Tensor& weight_c, const at::Tensor& bias,
    const OptionalTensor& c0, const OptionalTensor& scale_x, double scale_x_value,
    const OptionalTensor& mask_c, const OptionalTensor& mask_pad, const at::Tensor& c_all,
    bool bidirectional, bool has_skip_term) {
  const c10::cuda::CUDAGuard device_guard(U.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  return recurrence_backward_impl(grad_h, grad_c_last, U, x, weight_c, bias, c0, scale_x,
                                  scale_x_value, mask_c, mask_pad, c_all, bidirectional,
                                  has_skip_term, [stream](const RecurrenceDims& dims, const auto& args) {
                                    C10_CUDA_CHECK(launch_backward(dims, args, stream));
                                  });
}

}  // namespace

}  // namespace sru_lightning

TORCH_LIBRARY_IMPL(sru_lightning, CUDA, m) {
  m.impl("recurrence_forward", &sru_lightning::recurrence_forward_cuda);
  m.impl("recurrence_backward", &sru_lightning::recurrence_backward_cuda);
}
