// Tensor-level plumbing shared by the CPU and CUDA bindings: argument checks, sizes and
// output allocation. The math lives in sru_step.h.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "sru_step.h"

namespace sru_lightning {

using OptionalTensor = std::optional<at::Tensor>;

// Checks shapes, dtypes and devices (raising c10::Error, a Python ValueError/RuntimeError)
// and returns the sizes of the call.
RecurrenceDims check_recurrence_args(const at::Tensor& U, const OptionalTensor& x,
                                     const at::Tensor& weight_c, const at::Tensor& bias,
                                     const OptionalTensor& c0, const OptionalTensor& scale_x,
                                     const OptionalTensor& mask_c, const OptionalTensor& mask_pad,
                                     bool bidirectional, bool has_skip_term);

// Contiguous tensor or an undefined one; scale_x is converted to the accumulation dtype.
at::Tensor contiguous_or_undefined(const OptionalTensor& tensor);
at::Tensor scale_in_accumulate_dtype(const OptionalTensor& scale_x, at::ScalarType storage);

std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrence_forward_cpu(
    const at::Tensor& U, const OptionalTensor& x, const at::Tensor& weight_c,
    const at::Tensor& bias, const OptionalTensor& c0, const OptionalTensor& scale_x,
    double scale_x_value, const OptionalTensor& mask_c, const OptionalTensor& mask_pad,
    bool bidirectional, bool has_skip_term, bool store_c);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> recurrence_backward_cpu(
    const at::Tensor& grad_h, const OptionalTensor& grad_c_last, const at::Tensor& U,
    const OptionalTensor& x, const at::Tensor& weight_c, const at::Tensor& bias,
    const OptionalTensor& c0, const OptionalTensor& scale_x, double scale_x_value,
    const OptionalTensor& mask_c, const OptionalTensor& mask_pad, const at::Tensor& c_all,
    bool bidirectional, bool has_skip_term);

template <typename T>
const T* data_or_null(const at::Tensor& tensor) {
  return tensor.defined() ? tensor.const_data_ptr<T>() : nullptr;
}

}  // namespace sru_lightning
