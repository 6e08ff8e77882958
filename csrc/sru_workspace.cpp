// The caching allocator of the CPU kernels' outputs (output_tensor, release_cached_buffers;
// see sru_ops.h).
#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/accumulate.h>

#include <cstdlib>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sru_ops.h"

namespace sru_lightning {

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
