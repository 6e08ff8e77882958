// Operator schemas of the SRU recurrence (one TORCH_LIBRARY block), the argument checks
// shared by every device, and the CPU registrations.
#include <torch/library.h>

#include "sru_ops.h"

namespace sru_lightning {

namespace {

void check_same_storage(const char* name, const at::Tensor& tensor, const at::Tensor& U) {
  TORCH_CHECK_TYPE(tensor.scalar_type() == U.scalar_type(), "sru_lightning recurrence: `", name,
                   "` must have U's dtype ", U.scalar_type(), ", got ", tensor.scalar_type());
  TORCH_CHECK_VALUE(tensor.device() == U.device(), "sru_lightning recurrence: `", name,
                    "` must be on U's device ", U.device(), ", got ", tensor.device());
}

void check_optional(const char* name, const OptionalTensor& tensor, const at::Tensor& U,
                    at::IntArrayRef expected) {
  if (!tensor.has_value() || !tensor->defined()) return;
  check_same_storage(name, *tensor, U);
  TORCH_CHECK_VALUE(tensor->sizes() == expected, "sru_lightning recurrence: `", name,
                    "` must have shape ", expected, ", got ", tensor->sizes());
}

}  // namespace

RecurrenceDims check_recurrence_args(const at::Tensor& U, const OptionalTensor& x,
                                     const at::Tensor& weight_c, const at::Tensor& bias,
                                     const OptionalTensor& c0, const OptionalTensor& scale_x,
                                     const OptionalTensor& mask_c, const OptionalTensor& mask_pad,
                                     bool bidirectional, bool has_skip_term) {
  const auto storage = U.scalar_type();
  TORCH_CHECK_TYPE(storage == at::kFloat || storage == at::kDouble || storage == at::kHalf ||
                       storage == at::kBFloat16,
                   "sru_lightning recurrence: `U` must be float32, float64, float16 or bfloat16, got ",
                   storage);
  TORCH_CHECK_VALUE(U.dim() == 3, "sru_lightning recurrence: `U` must have shape (L, B, dirs*D*k), got ",
                    U.sizes());
  const int64_t directions = bidirectional ? 2 : 1;
  check_same_storage("bias", bias, U);
  TORCH_CHECK_VALUE(bias.dim() == 1 && bias.numel() > 0 && bias.numel() % (2 * directions) == 0,
                    "sru_lightning recurrence: `bias` must have shape (2*dirs*D,) with dirs=",
                    directions, ", got ", bias.sizes());
  RecurrenceDims dims{};
  dims.length = U.size(0);
  dims.batch = U.size(1);
  dims.directions = directions;
  dims.hidden = bias.numel() / (2 * directions);
  const int64_t width = directions * dims.hidden;
  TORCH_CHECK_VALUE(U.size(2) == 3 * width || U.size(2) == 4 * width,
                    "sru_lightning recurrence: `U` must have last dimension ", 3 * width, " or ",
                    4 * width, " (dirs*D*k), got ", U.sizes());
  dims.k = U.size(2) / width;
  dims.skip_from_x = has_skip_term && dims.k == 3;
  dims.skip_from_u = has_skip_term && dims.k == 4;

  check_same_storage("weight_c", weight_c, U);
  dims.per_step_weight_c = weight_c.dim() != 1;
  if (dims.per_step_weight_c) {
    TORCH_CHECK_VALUE(weight_c.sizes() == at::IntArrayRef({dims.length, dims.batch, 2 * width}),
                      "sru_lightning recurrence: `weight_c` must have shape (", 2 * width,
                      ",) or (", dims.length, ", ", dims.batch, ", ", 2 * width, "), got ",
                      weight_c.sizes());
  } else {
    TORCH_CHECK_VALUE(weight_c.numel() == 2 * width, "sru_lightning recurrence: `weight_c` must have shape (",
                      2 * width, ",), got ", weight_c.sizes());
  }
  if (dims.skip_from_x) {
    TORCH_CHECK_VALUE(x.has_value() && x->defined(),
                      "sru_lightning recurrence: `x` is required when k == 3 and has_skip_term=True");
    check_optional("x", x, U, {dims.length, dims.batch, width});
  }
  check_optional("c0", c0, U, {dims.batch, width});
  check_optional("mask_c", mask_c, U, {dims.batch, width});
  if (mask_pad.has_value() && mask_pad->defined()) {
    TORCH_CHECK_TYPE(mask_pad->scalar_type() == at::kBool,
                     "sru_lightning recurrence: `mask_pad` must be bool, got ", mask_pad->scalar_type());
    TORCH_CHECK_VALUE(mask_pad->sizes() == at::IntArrayRef({dims.length, dims.batch}),
                      "sru_lightning recurrence: `mask_pad` must have shape (", dims.length, ", ",
                      dims.batch, "), got ", mask_pad->sizes());
    TORCH_CHECK_VALUE(mask_pad->device() == U.device(),
                      "sru_lightning recurrence: `mask_pad` must be on U's device");
  }
  if (scale_x.has_value() && scale_x->defined()) {
    TORCH_CHECK_VALUE(scale_x->numel() == 1,
                      "sru_lightning recurrence: `scale_x` must have one element, got shape ",
                      scale_x->sizes());
    // The kernels read it through a pointer on U's device.
    TORCH_CHECK_VALUE(scale_x->device() == U.device(), "sru_lightning recurrence: `scale_x` must be on U's device ",
                      U.device(), ", got ", scale_x->device());
  }
  return dims;
}

at::Tensor contiguous_or_undefined(const OptionalTensor& tensor) {
  if (!tensor.has_value() || !tensor->defined()) return at::Tensor();
  return tensor->contiguous();
}

at::Tensor scale_in_accumulate_dtype(const OptionalTensor& scale_x, at::ScalarType storage) {
  if (!scale_x.has_value() || !scale_x->defined()) return at::Tensor();
  const auto accumulate = storage == at::kDouble ? at::kDouble : at::kFloat;
  return scale_x->reshape({1}).to(accumulate).contiguous();
}

}  // namespace sru_lightning

TORCH_LIBRARY(sru_lightning, m) {
  // The fake (meta) kernels and the autograd formula are registered from Python.
  m.set_python_module("sru_lightning.ops.op");
  m.def(
      "recurrence_forward(Tensor U, Tensor? x, Tensor weight_c, Tensor bias, Tensor? c0, "
      "Tensor? scale_x, float scale_x_value, Tensor? mask_c, Tensor? mask_pad, "
      "bool bidirectional, bool has_skip_term, bool store_c) -> (Tensor h, Tensor c_last, Tensor c_all)");
  m.def(
      "recurrence_backward(Tensor grad_h, Tensor? grad_c_last, Tensor U, Tensor? x, Tensor weight_c, "
      "Tensor bias, Tensor? c0, Tensor? scale_x, float scale_x_value, Tensor? mask_c, "
      "Tensor? mask_pad, Tensor c_all, bool bidirectional, bool has_skip_term) -> "
      "(Tensor grad_U, Tensor grad_x, Tensor grad_weight_c, Tensor grad_bias, Tensor grad_c0)");
  m.def("cpu_vector_level() -> int", &sru_lightning::cpu_vector_level);
}

TORCH_LIBRARY_IMPL(sru_lightning, CPU, m) {
  m.impl("recurrence_forward", &sru_lightning::recurrence_forward_cpu);
  m.impl("recurrence_backward", &sru_lightning::recurrence_backward_cpu);
}
