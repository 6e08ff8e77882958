// Tensor-level plumbing shared by the CPU and CUDA bindings: the op's arguments, their
// checks (sru_checks.cpp), output allocation (sru_workspace.cpp) and the device-independent
// forward and backward. The math lives in sru_step.h; the op registration in sru_ops.cpp.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "sru_step.h"

namespace sru_lightning {

using OptionalTensor = std::optional<at::Tensor>;

// Schemas of the two recurrence ops, for every namespace that registers them (sru_lightning,
// and sru_lightning_cuda_emulated for the CPU emulation of the CUDA kernels).
constexpr const char* kRecurrenceForwardSchema =
    "recurrence_forward(Tensor U, Tensor? x, Tensor weight_c, Tensor bias, Tensor? c0, "
    "Tensor? scale_x, float scale_x_value, Tensor? mask_c, Tensor? mask_pad, Tensor? reset, "
    "Tensor? c_starts, bool bidirectional, bool has_skip_term, bool store_c) -> "
    "(Tensor h, Tensor c_last, Tensor c_all)";
constexpr const char* kRecurrenceBackwardSchema =
    "recurrence_backward(Tensor grad_h, Tensor? grad_c_last, Tensor? grad_c_all, Tensor U, Tensor? x, "
    "Tensor weight_c, Tensor bias, Tensor? c0, Tensor? scale_x, float scale_x_value, Tensor? mask_c, "
    "Tensor? mask_pad, Tensor? reset, Tensor? c_starts, Tensor c_all, bool bidirectional, "
    "bool has_skip_term) -> (Tensor grad_U, Tensor grad_x, Tensor grad_weight_c, Tensor grad_bias, "
    "Tensor grad_c0, Tensor grad_c_starts)";

// The arguments both recurrence ops take, read by name from a boxed call: the one C++ form
// of the argument list, which every binding (CPU, CUDA, emulated CUDA) receives whole.
struct RecurrenceArgs {
  at::Tensor U;
  OptionalTensor x;
  at::Tensor weight_c;
  at::Tensor bias;
  OptionalTensor c0;
  OptionalTensor scale_x;
  double scale_x_value;
  OptionalTensor mask_c;
  OptionalTensor mask_pad;
  OptionalTensor reset;
  OptionalTensor c_starts;
  bool bidirectional;
  bool has_skip_term;
};

// The arguments of one boxed call on the stack, looked up by their schema names.
class CallArguments {
 public:
  CallArguments(const c10::OperatorHandle& op, const torch::jit::Stack* stack);
  const c10::IValue& operator[](const char* name) const;
  size_t size() const { return schema_.arguments().size(); }
  RecurrenceArgs recurrence() const;

 private:
  const c10::FunctionSchema& schema_;
  const c10::IValue* first_;
};

// A boxed kernel: reads its arguments, replaces them on the stack by the outputs of `run`.
template <typename Run>
void run_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack, Run&& run) {
  const CallArguments arguments(op, stack);
  auto outputs = run(arguments);
  torch::jit::drop(*stack, arguments.size());
  std::apply([stack](auto&... tensors) { torch::jit::push(*stack, std::move(tensors)...); }, outputs);
}

// Checks shapes, dtypes and devices (raising c10::Error, a Python ValueError/RuntimeError)
// and returns the sizes of the call.
RecurrenceDims check_recurrence_args(const RecurrenceArgs& args);

// The ATen dtype of accumulate_t for a storage dtype (float32 or float64).
at::ScalarType accumulate_scalar_type(at::ScalarType storage);

// Contiguous tensor or an undefined one; scale_x is converted to the accumulation dtype.
at::Tensor contiguous_or_undefined(const OptionalTensor& tensor);
at::Tensor scale_in_accumulate_dtype(const OptionalTensor& scale_x, at::ScalarType storage);

// An uninitialized output of the kernels. CPU outputs of at least kCachedBufferMinBytes are
// recycled: when such a tensor dies its buffer goes back to a cache and the next output of
// the same byte size reuses it, so a training loop does not fault in fresh pages for h,
// c_all and the gradients at every step (faulting in 8 MiB of fresh pages can take longer
// than the forward kernel that fills them). SRU_LIGHTNING_CPU_BUFFER_CACHE_MB caps the idle bytes kept (default
// 256, 0 turns the cache off); release_cached_buffers() frees them. (sru_workspace.cpp)
constexpr int64_t kCachedBufferMinBytes = int64_t(1) << 20;
at::Tensor output_tensor(at::IntArrayRef sizes, const at::TensorOptions& options);
// Frees every idle cached buffer; returns the bytes freed.
int64_t release_cached_buffers();

// 0 = baseline, 1 = AVX2+FMA+F16C, 2 = AVX-512, 3 = AVX-512 with BF16 conversions: the
// vector code the CPU kernels run; cpu_vector_levels() names them in that order.
int64_t cpu_vector_level();
std::vector<std::string> cpu_vector_levels();

// The CPU kernels of the two ops (sru_cpu.cpp), boxed.
void recurrence_forward_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void recurrence_backward_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);

template <typename T>
const T* data_or_null(const at::Tensor& tensor) {
  return tensor.defined() ? tensor.const_data_ptr<T>() : nullptr;
}

// The inputs both passes read, contiguous (scale_x in the accumulation dtype). It owns the
// tensors whose raw pointers `fill` hands to the kernel, so they outlive the launch.
struct ContiguousInputs {
  at::Tensor U, x, weight_c, bias, c0, mask_c, mask_pad, reset, c_starts, scale_x;
  double scale_x_value;

  ContiguousInputs(const RecurrenceDims& dims, const RecurrenceArgs& args)
      : U(args.U.contiguous()),
        x(dims.skip_from_x ? args.x->contiguous() : at::Tensor()),
        weight_c(args.weight_c.contiguous()),
        bias(args.bias.contiguous()),
        c0(contiguous_or_undefined(args.c0)),
        mask_c(contiguous_or_undefined(args.mask_c)),
        mask_pad(contiguous_or_undefined(args.mask_pad)),
        reset(contiguous_or_undefined(args.reset)),
        c_starts(contiguous_or_undefined(args.c_starts)),
        scale_x(scale_in_accumulate_dtype(args.scale_x, args.U.scalar_type())),
        scale_x_value(args.scale_x_value) {}

  template <typename T, typename A>
  void fill(RecurrenceInputs<T, A>& args) const {
    args.U = U.const_data_ptr<T>();
    args.x = data_or_null<T>(x);
    args.weight_c = weight_c.const_data_ptr<T>();
    args.bias = bias.const_data_ptr<T>();
    args.c0 = data_or_null<T>(c0);
    args.mask_c = data_or_null<T>(mask_c);
    args.mask_pad = data_or_null<bool>(mask_pad);
    args.reset = data_or_null<bool>(reset);
    args.c_starts = data_or_null<T>(c_starts);
    args.scale_x = data_or_null<A>(scale_x);
    args.scale_x_value = static_cast<A>(scale_x_value);
  }
};


// Forward on any device: checks, contiguous inputs, outputs, dtype dispatch; `launch(dims,
// args)` runs the device kernel on ForwardArgs<T, A> for the storage type T.
template <typename Launch>
std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrence_forward_impl(const CallArguments& call,
                                                                       Launch&& launch) {
  const RecurrenceArgs args_in = call.recurrence();
  const bool store_c = call["store_c"].toBool();
  const at::Tensor& U = args_in.U;
  const RecurrenceDims dims = check_recurrence_args(args_in);
  const int64_t width = dims.directions * dims.hidden;
  const ContiguousInputs inputs(dims, args_in);
  at::Tensor h = output_tensor({dims.length, dims.batch, width}, U.options());
  at::Tensor c_last = at::empty({dims.batch, width}, U.options());
  at::Tensor c_all = store_c ? output_tensor({dims.length, dims.batch, width}, U.options())
                             : at::empty({0}, U.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, U.scalar_type(), "sru_recurrence_forward", [&] {
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
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> recurrence_backward_impl(
    const CallArguments& call, Launch&& launch) {
  const RecurrenceArgs args_in = call.recurrence();
  const at::Tensor& U = args_in.U;
  const at::Tensor& grad_h = call["grad_h"].toTensor();
  const OptionalTensor grad_c_last = call["grad_c_last"].toOptional<at::Tensor>();
  const OptionalTensor grad_c_all = call["grad_c_all"].toOptional<at::Tensor>();
  const at::Tensor& c_all = call["c_all"].toTensor();
  const RecurrenceDims dims = check_recurrence_args(args_in);
  const int64_t width = dims.directions * dims.hidden;
  TORCH_CHECK_VALUE(c_all.sizes() == at::IntArrayRef({dims.length, dims.batch, width}),
                    "sru_lightning recurrence backward: `c_all` must have shape (", dims.length,
                    ", ", dims.batch, ", ", width, "), got ", c_all.sizes(),
                    " (the forward ran without storing the states)");
  TORCH_CHECK_VALUE(grad_h.sizes() == c_all.sizes(), "sru_lightning recurrence backward: `grad_h` must have shape ",
                    c_all.sizes(), ", got ", grad_h.sizes());
  const auto options = U.options();
  const auto accumulate = accumulate_scalar_type(U.scalar_type());
  const ContiguousInputs inputs(dims, args_in);
  const at::Tensor grad_h_c = grad_h.to(U.scalar_type()).contiguous();
  const at::Tensor grad_c_last_c =
      grad_c_last.has_value() && grad_c_last->defined() ? grad_c_last->to(U.scalar_type()).contiguous()
                                                        : at::Tensor();
  if (grad_c_all.has_value() && grad_c_all->defined()) {
    TORCH_CHECK_VALUE(grad_c_all->sizes() == c_all.sizes(), "sru_lightning recurrence backward: `grad_c_all` must have shape ",
                      c_all.sizes(), ", got ", grad_c_all->sizes());
  }
  const at::Tensor grad_c_all_c = grad_c_all.has_value() && grad_c_all->defined()
                                      ? grad_c_all->to(U.scalar_type()).contiguous()
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
  // Written by the kernels at the steps that read c_starts only: zero elsewhere.
  at::Tensor grad_c_starts = inputs.c_starts.defined() ? at::zeros(inputs.c_starts.sizes(), options)
                                                        : at::empty({0}, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, U.scalar_type(), "sru_recurrence_backward", [&] {
    using A = accumulate_t<scalar_t>;
    BackwardArgs<scalar_t, A> args{};
    inputs.fill(args);
    args.grad_h = grad_h_c.const_data_ptr<scalar_t>();
    args.grad_c_last = data_or_null<scalar_t>(grad_c_last_c);
    args.grad_c_all = data_or_null<scalar_t>(grad_c_all_c);
    args.c_all = c_all_c.const_data_ptr<scalar_t>();
    args.grad_U = grad_U.mutable_data_ptr<scalar_t>();
    args.grad_x = dims.skip_from_x ? grad_x.mutable_data_ptr<scalar_t>() : nullptr;
    args.grad_weight_c = dims.per_step_weight_c ? grad_weight_c_step.mutable_data_ptr<scalar_t>() : nullptr;
    args.weight_c_partials = dims.per_step_weight_c ? nullptr : weight_c_partials.mutable_data_ptr<A>();
    args.bias_partials = bias_partials.mutable_data_ptr<A>();
    args.grad_c0 = grad_c0.mutable_data_ptr<scalar_t>();
    args.grad_c_starts = inputs.c_starts.defined() ? grad_c_starts.mutable_data_ptr<scalar_t>() : nullptr;
    launch(dims, args);
  });
  at::Tensor grad_weight_c = dims.per_step_weight_c
                                 ? grad_weight_c_step
                                 : weight_c_partials.sum(0).to(U.scalar_type()).view(args_in.weight_c.sizes());
  at::Tensor grad_bias = bias_partials.sum(0).to(U.scalar_type());
  return {grad_U, grad_x, grad_weight_c, grad_bias, grad_c0, grad_c_starts};
}

}  // namespace sru_lightning
