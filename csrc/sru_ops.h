// Tensor-level plumbing shared by the CPU and CUDA bindings: argument checks, sizes and
// output allocation. The math lives in sru_step.h.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <optional>
#include <tuple>

#include "sru_step.h"

namespace sru_lightning {

using OptionalTensor = std::optional<at::Tensor>;

// Schemas of the two recurrence ops, for every namespace that registers them (sru_lightning,
// and sru_lightning_cuda_emulated for the CPU emulation of the CUDA kernels).
constexpr const char* kRecurrenceForwardSchema =
    "recurrence_forward(Tensor U, Tensor? x, Tensor weight_c, Tensor bias, Tensor? c0, "
    "Tensor? scale_x, float scale_x_value, Tensor? mask_c, Tensor? mask_pad, "
    "bool bidirectional, bool has_skip_term, bool store_c) -> (Tensor h, Tensor c_last, Tensor c_all)";
constexpr const char* kRecurrenceBackwardSchema =
    "recurrence_backward(Tensor grad_h, Tensor? grad_c_last, Tensor U, Tensor? x, Tensor weight_c, "
    "Tensor bias, Tensor? c0, Tensor? scale_x, float scale_x_value, Tensor? mask_c, "
    "Tensor? mask_pad, Tensor c_all, bool bidirectional, bool has_skip_term) -> "
    "(Tensor grad_U, Tensor grad_x, Tensor grad_weight_c, Tensor grad_bias, Tensor grad_c0)";

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

// An uninitialized output of the kernels. CPU outputs of at least kCachedBufferMinBytes are
// recycled: when such a tensor dies its buffer goes back to a cache and the next output of
// the same byte size reuses it, so a training loop does not fault in fresh pages for h,
// c_all and the gradients at every step (faulting in 8 MiB of fresh pages can take longer
// than the forward kernel that fills them). SRU_LIGHTNING_CPU_BUFFER_CACHE_MB caps the idle bytes kept (default
// 256, 0 turns the cache off); release_cached_buffers() frees them.
constexpr int64_t kCachedBufferMinBytes = int64_t(1) << 20;
at::Tensor output_tensor(at::IntArrayRef sizes, const at::TensorOptions& options);
// Frees every idle cached buffer; returns the bytes freed.
int64_t release_cached_buffers();

// 0 = baseline, 1 = AVX2+FMA+F16C, 2 = AVX-512, 3 = AVX-512 with BF16 conversions: the
// vector code the CPU kernels run.
int64_t cpu_vector_level();

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

// The inputs both passes read, contiguous (scale_x in the accumulation dtype). It owns the
// tensors whose raw pointers `fill` hands to the kernel, so they outlive the launch.
struct ContiguousInputs {
  at::Tensor U, x, weight_c, bias, c0, mask_c, mask_pad, scale_x;
  double scale_x_value;

  ContiguousInputs(const RecurrenceDims& dims, const at::Tensor& U_in, const OptionalTensor& x_in,
                   const at::Tensor& weight_c_in, const at::Tensor& bias_in,
                   const OptionalTensor& c0_in, const OptionalTensor& scale_x_in,
                   double scale_x_value_in, const OptionalTensor& mask_c_in,
                   const OptionalTensor& mask_pad_in)
      : U(U_in.contiguous()),
        x(dims.skip_from_x ? x_in->contiguous() : at::Tensor()),
        weight_c(weight_c_in.contiguous()),
        bias(bias_in.contiguous()),
        c0(contiguous_or_undefined(c0_in)),
        mask_c(contiguous_or_undefined(mask_c_in)),
        mask_pad(contiguous_or_undefined(mask_pad_in)),
        scale_x(scale_in_accumulate_dtype(scale_x_in, U_in.scalar_type())),
        scale_x_value(scale_x_value_in) {}

  template <typename T, typename A>
  void fill(RecurrenceInputs<T, A>& args) const {
    args.U = U.const_data_ptr<T>();
    args.x = data_or_null<T>(x);
    args.weight_c = weight_c.const_data_ptr<T>();
    args.bias = bias.const_data_ptr<T>();
    args.c0 = data_or_null<T>(c0);
    args.mask_c = data_or_null<T>(mask_c);
    args.mask_pad = data_or_null<bool>(mask_pad);
    args.scale_x = data_or_null<A>(scale_x);
    args.scale_x_value = static_cast<A>(scale_x_value);
  }
};


// Forward on any device: checks, contiguous inputs, outputs, dtype dispatch; `launch(dims,
// args)` runs the device kernel on ForwardArgs<T, A> for the storage type T.
template <typename Launch>
std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrence_forward_impl(
    const at::Tensor& U, const OptionalTensor& x, const at::Tensor& weight_c,
    const at::Tensor& bias, const OptionalTensor& c0, const OptionalTensor& scale_x,
    double scale_x_value, const OptionalTensor& mask_c, const OptionalTensor& mask_pad,
    bool bidirectional, bool has_skip_term, bool store_c, Launch&& launch) {
  const RecurrenceDims dims = check_recurrence_args(U, x, weight_c, bias, c0, scale_x, mask_c,
                                                    mask_pad, bidirectional, has_skip_term);
  const int64_t width = dims.directions * dims.hidden;
  const ContiguousInputs inputs(dims, U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c,
                                mask_pad);
  at::Tensor h = output_tensor({dims.length, dims.batch, width}, U.options());
  at::Tensor c_last = at::empty({dims.batch, width}, U.options());
  at::Tensor c_all = store_c ? output_tensor({dims.length, dims.batch, width}, U.options())
                             : at::empty({0}, U.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, U.scalar_type(), "sru_forward_cpu", [&] {
    using A = accumulate_t<scalar_t>;
    ForwardArgs<scalar_t, A> args{};
    inputs.fill(args);
    args.h = h.mutable_data_ptr<scalar_t>();
    args.c_last = c_last.mutable_data_ptr<scalar_t>();
    args.c_all = store_c ? c_all.mutable_data_ptr<scalar_t>() : nullptr;
    launch(dims, args);
  });
  return {h, c_last, c_all};
}

// Backward on any device; `launch(dims, args)` runs the kernel on BackwardArgs<T, A>.
// Vector weight_c and bias gradients come back from the kernel as per-batch partial sums
// in the accumulation dtype and are reduced over the batch here.
template <typename Launch>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> recurrence_backward_impl(
    const at::Tensor& grad_h, const OptionalTensor& grad_c_last, const at::Tensor& U,
    const OptionalTensor& x, const at::Tensor& weight_c, const at::Tensor& bias,
    const OptionalTensor& c0, const OptionalTensor& scale_x, double scale_x_value,
    const OptionalTensor& mask_c, const OptionalTensor& mask_pad, const at::Tensor& c_all,
    bool bidirectional, bool has_skip_term, Launch&& launch) {
  const RecurrenceDims dims = check_recurrence_args(U, x, weight_c, bias, c0, scale_x, mask_c,
                                                    mask_pad, bidirectional, has_skip_term);
  const int64_t width = dims.directions * dims.hidden;
  TORCH_CHECK_VALUE(c_all.sizes() == at::IntArrayRef({dims.length, dims.batch, width}),
                    "sru_lightning recurrence backward: `c_all` must have shape (", dims.length,
                    ", ", dims.batch, ", ", width, "), got ", c_all.sizes(),
                    " (the forward ran without storing the states)");
  TORCH_CHECK_VALUE(grad_h.sizes() == c_all.sizes(), "sru_lightning recurrence backward: `grad_h` must have shape ",
                    c_all.sizes(), ", got ", grad_h.sizes());
  const auto options = U.options();
  const auto accumulate = U.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const ContiguousInputs inputs(dims, U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c,
                                mask_pad);
  const at::Tensor grad_h_c = grad_h.to(U.scalar_type()).contiguous();
  const at::Tensor grad_c_last_c =
      grad_c_last.has_value() && grad_c_last->defined() ? grad_c_last->to(U.scalar_type()).contiguous()
                                                        : at::Tensor();
  const at::Tensor c_all_c = c_all.contiguous();

  at::Tensor grad_U = output_tensor(inputs.U.sizes(), options);
  at::Tensor grad_x = dims.skip_from_x ? output_tensor(inputs.x.sizes(), options) : at::empty({0}, options);
  at::Tensor grad_weight_c_step =
      dims.per_step_weight_c ? output_tensor(inputs.weight_c.sizes(), options) : at::Tensor();
  at::Tensor weight_c_partials = dims.per_step_weight_c
                                     ? at::Tensor()
                                     : at::empty({dims.batch, 2 * width}, options.dtype(accumulate));
  at::Tensor bias_partials = at::empty({dims.batch, 2 * width}, options.dtype(accumulate));
  at::Tensor grad_c0 = at::empty({dims.batch, width}, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, U.scalar_type(), "sru_backward_cpu", [&] {
    using A = accumulate_t<scalar_t>;
    BackwardArgs<scalar_t, A> args{};
    inputs.fill(args);
    args.grad_h = grad_h_c.const_data_ptr<scalar_t>();
    args.grad_c_last = data_or_null<scalar_t>(grad_c_last_c);
    args.c_all = c_all_c.const_data_ptr<scalar_t>();
    args.grad_U = grad_U.mutable_data_ptr<scalar_t>();
    args.grad_x = dims.skip_from_x ? grad_x.mutable_data_ptr<scalar_t>() : nullptr;
    args.grad_weight_c = dims.per_step_weight_c ? grad_weight_c_step.mutable_data_ptr<scalar_t>() : nullptr;
    args.weight_c_partials = dims.per_step_weight_c ? nullptr : weight_c_partials.mutable_data_ptr<A>();
    args.bias_partials = bias_partials.mutable_data_ptr<A>();
    args.grad_c0 = grad_c0.mutable_data_ptr<scalar_t>();
    launch(dims, args);
  });
  at::Tensor grad_weight_c = dims.per_step_weight_c
                                 ? grad_weight_c_step
                                 : weight_c_partials.sum(0).to(U.scalar_type()).view(weight_c.sizes());
  at::Tensor grad_bias = bias_partials.sum(0).to(U.scalar_type());
  return {grad_U, grad_x, grad_weight_c, grad_bias, grad_c0};
}

}  // namespace sru_lightning
