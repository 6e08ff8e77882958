// Operator schemas of the SRU recurrence (one TORCH_LIBRARY block), the argument checks
// shared by every device, and the CPU registrations.
#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <cstdlib>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <vector>

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

namespace {

// CPU buffers by byte size: the ones tensors hold (live) and the idle ones, oldest first.
// The oldest idle buffers are freed once the idle bytes pass the cap.
class BufferCache {
 public:
  BufferCache() : capacity_(capacity_from_environment()) {}

  int64_t capacity() const { return capacity_; }

  void* take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    void* data = nullptr;
    for (auto entry = idle_.rbegin(); entry != idle_.rend(); ++entry) {
      if (entry->bytes == bytes) {
        data = entry->data;
        idle_bytes_ -= bytes;
        idle_.erase(std::next(entry).base());
        break;
      }
    }
    if (data == nullptr) data = c10::alloc_cpu(static_cast<size_t>(bytes));
    live_[data] = bytes;
    return data;
  }

  void give(void* data) {
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto live = live_.find(data);
      TORCH_INTERNAL_ASSERT(live != live_.end(), "sru_lightning: freeing a buffer the cache did not hand out");
      idle_.push_back({data, live->second});
      idle_bytes_ += live->second;
      live_.erase(live);
      while (idle_bytes_ > capacity_ && !idle_.empty()) {
        evicted.push_back(idle_.front().data);
        idle_bytes_ -= idle_.front().bytes;
        idle_.erase(idle_.begin());
      }
    }
    for (void* buffer : evicted) c10::free_cpu(buffer);
  }

  int64_t release() {
    std::vector<Entry> freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      freed.swap(idle_);
      idle_bytes_ = 0;
    }
    int64_t bytes = 0;
    for (const Entry& entry : freed) {
      c10::free_cpu(entry.data);
      bytes += entry.bytes;
    }
    return bytes;
  }

 private:
  struct Entry {
    void* data;
    int64_t bytes;
  };

  static int64_t capacity_from_environment() {
    const char* value = std::getenv("SRU_LIGHTNING_CPU_BUFFER_CACHE_MB");
    if (value == nullptr || *value == '\0') return int64_t(256) << 20;
    char* end = nullptr;
    const long long megabytes = std::strtoll(value, &end, 10);
    TORCH_CHECK_VALUE(end != value && *end == '\0' && megabytes >= 0,
                      "SRU_LIGHTNING_CPU_BUFFER_CACHE_MB must be a whole number of MiB >= 0, got '", value, "'");
    return static_cast<int64_t>(megabytes) << 20;
  }

  std::mutex mutex_;
  std::unordered_map<void*, int64_t> live_;
  std::vector<Entry> idle_;
  int64_t idle_bytes_ = 0;
  const int64_t capacity_;
};

// Never destroyed: tensors may die during interpreter shutdown, after static destructors.
BufferCache& buffer_cache() {
  static BufferCache* cache = new BufferCache();
  return *cache;
}

// A CPU allocator drawing on the cache, so its tensors are ordinary (resizable) CPU tensors.
class RecyclingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* data = bytes == 0 ? nullptr : buffer_cache().take(static_cast<int64_t>(bytes));
    return {data, data, &release_buffer, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_buffer; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static void release_buffer(void* data) {
    if (data != nullptr) buffer_cache().give(data);
  }
};

RecyclingAllocator recycling_allocator;

}  // namespace

at::Tensor output_tensor(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(options.dtype().itemsize());
  if (!options.device().is_cpu() || bytes < kCachedBufferMinBytes || buffer_cache().capacity() == 0) {
    return at::empty(sizes, options);
  }
  return at::detail::empty_generic(sizes, &recycling_allocator, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()), std::nullopt);
}

int64_t release_cached_buffers() {
  return buffer_cache().release();
}

}  // namespace sru_lightning

// The CPU emulation of the CUDA kernels links this file for its plumbing and registers its
// own namespace (sru_cuda_emulated.cpp).
#ifndef SRU_CUDA_EMULATION

TORCH_LIBRARY(sru_lightning, m) {
  // The fake (meta) kernels and the autograd formula are registered from Python.
  m.set_python_module("sru_lightning.ops.op");
  m.def(sru_lightning::kRecurrenceForwardSchema);
  m.def(sru_lightning::kRecurrenceBackwardSchema);
  m.def("cpu_vector_level() -> int", &sru_lightning::cpu_vector_level);
  m.def("release_cached_buffers() -> int", &sru_lightning::release_cached_buffers);
}

TORCH_LIBRARY_IMPL(sru_lightning, CPU, m) {
  m.impl("recurrence_forward", &sru_lightning::recurrence_forward_cpu);
  m.impl("recurrence_backward", &sru_lightning::recurrence_backward_cpu);
}

#endif  // SRU_CUDA_EMULATION
