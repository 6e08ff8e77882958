// The recurrence's arguments: read from a boxed call by name, checked against each other, and
// prepared for the kernels (contiguous, scale_x in the accumulation dtype).
#include "sru_ops.h"

namespace sru_lightning {

CallArguments::CallArguments(const c10::OperatorHandle& op, const torch::jit::Stack* stack)
    : schema_(op.schema()), first_(stack->data() + stack->size() - op.schema().arguments().size()) {}

const c10::IValue& CallArguments::operator[](const char* name) const {
  const std::optional<int> index = schema_.argumentIndexWithName(name);
  TORCH_INTERNAL_ASSERT(index.has_value(), "sru_lightning: ", schema_.name(), " has no argument `", name, "`");
  return first_[*index];
}

RecurrenceArgs CallArguments::recurrence() const {
  const auto& self = *this;
  return RecurrenceArgs{
      self["U"].toTensor(),
      self["x"].toOptional<at::Tensor>(),
      self["weight_c"].toTensor(),
      self["bias"].toTensor(),
      self["c0"].toOptional<at::Tensor>(),
      self["scale_x"].toOptional<at::Tensor>(),
      self["scale_x_value"].toDouble(),
      self["mask_c"].toOptional<at::Tensor>(),
      self["mask_pad"].toOptional<at::Tensor>(),
      self["reset"].toOptional<at::Tensor>(),
      self["c_starts"].toOptional<at::Tensor>(),
      self["bidirectional"].toBool(),
      self["has_skip_term"].toBool(),
  };
}

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

// A bool (L, B) flag per time step and batch entry: mask_pad and reset.
void check_step_flags(const char* name, const OptionalTensor& flags, const at::Tensor& U,
                      const RecurrenceDims& dims) {
  if (!flags.has_value() || !flags->defined()) return;
  TORCH_CHECK_TYPE(flags->scalar_type() == at::kBool, "sru_lightning recurrence: `", name,
                   "` must be bool, got ", flags->scalar_type());
  TORCH_CHECK_VALUE(flags->sizes() == at::IntArrayRef({dims.length, dims.batch}), "sru_lightning recurrence: `",
                    name, "` must have shape (", dims.length, ", ", dims.batch, "), got ", flags->sizes());
  TORCH_CHECK_VALUE(flags->device() == U.device(), "sru_lightning recurrence: `", name,
                    "` must be on U's device ", U.device(), ", got ", flags->device());
}

}  // namespace

RecurrenceDims check_recurrence_args(const RecurrenceArgs& args) {
  const auto& [U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c, mask_pad, reset, c_starts,
               bidirectional, has_skip_term] = args;
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
  check_step_flags("mask_pad", mask_pad, U, dims);
  check_step_flags("reset", reset, U, dims);
  if (c_starts.has_value() && c_starts->defined()) {
    TORCH_CHECK_VALUE(reset.has_value() && reset->defined(),
                      "sru_lightning recurrence: `c_starts` gives the state each document starts from, "
                      "so it needs `reset` (where the documents start), got reset=None");
    check_optional("c_starts", c_starts, U, {dims.length, dims.batch, width});
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

at::ScalarType accumulate_scalar_type(at::ScalarType storage) {
  return AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, storage, "sru_accumulate_scalar_type",
                                         [] { return c10::CppTypeToScalarType<accumulate_t<scalar_t>>::value; });
}

at::Tensor contiguous_or_undefined(const OptionalTensor& tensor) {
  if (!tensor.has_value() || !tensor->defined()) return at::Tensor();
  return tensor->contiguous();
}

at::Tensor scale_in_accumulate_dtype(const OptionalTensor& scale_x, at::ScalarType storage) {
  if (!scale_x.has_value() || !scale_x->defined()) return at::Tensor();
  return scale_x->reshape({1}).to(accumulate_scalar_type(storage)).contiguous();
}

}  // namespace sru_lightning
