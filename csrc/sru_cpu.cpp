// CPU kernels of the SRU recurrence: this file picks the vector level and splits the work.
// Columns are grouped in blocks (one batch element, one direction, up to kBlock hidden units)
// and at::parallel_for hands each thread a contiguous range of blocks. A thread keeps the
// state of up to kChunkBlocks blocks and runs the time loop over them step by step, so each
// step streams a long contiguous stretch of U, x and h. Per block and step, the inputs are
// gathered into small float arrays (half storage is widened with vector conversions), the
// step math of sru_step.h runs over them in one branch-free loop the compiler vectorizes, and
// the results are narrowed back to the storage type on store. The block loops live in
// sru_cpu_blocks.h, compiled once per vector level (sru_cpu_<level>.cpp).
#include <ATen/Parallel.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "sru_cpu_levels.h"

namespace sru_lightning {

namespace {

#ifdef SRU_X86_LEVELS
// The level SRU_LIGHTNING_CPU_VECTORS names (any level below the widest), else the widest.
VectorLevel level_cap() {
  const char* cap_name = std::getenv("SRU_LIGHTNING_CPU_VECTORS");
  for (int level = 0; cap_name != nullptr && level < static_cast<int>(VectorLevel::avx512_bf16); ++level) {
    if (std::strcmp(cap_name, kVectorLevelNames[level]) == 0) return static_cast<VectorLevel>(level);
  }
  return VectorLevel::avx512_bf16;
}
#endif

// The widest level this processor supports; SRU_LIGHTNING_CPU_VECTORS=baseline|avx2|avx512
// caps it (to test every path on one machine, or to rule the wide paths out when debugging).
VectorLevel processor_level() {
#ifdef SRU_X86_LEVELS
  static const VectorLevel level = [] {
    __builtin_cpu_init();
    VectorLevel supported = VectorLevel::baseline;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      supported = VectorLevel::avx2;
    }
    if (supported == VectorLevel::avx2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")) {
      supported = VectorLevel::avx512;
    }
    if (supported == VectorLevel::avx512 && __builtin_cpu_supports("avx512bf16")) {
      supported = VectorLevel::avx512_bf16;
    }
    return std::min(supported, level_cap());
  }();
  return level;
#else
  return VectorLevel::baseline;
#endif
}

// The table of a level this library holds (it was built with SRU_CPU_WITH_<LEVEL>), or null.
const LevelKernels* compiled_level(VectorLevel level) {
  switch (level) {
#ifdef SRU_CPU_WITH_AVX512_BF16
    case VectorLevel::avx512_bf16:
      return &avx512_bf16_kernels();
#endif
#ifdef SRU_CPU_WITH_AVX512
    case VectorLevel::avx512:
      return &avx512_kernels();
#endif
#ifdef SRU_CPU_WITH_AVX2
    case VectorLevel::avx2:
      return &avx2_kernels();
#endif
#ifdef SRU_CPU_WITH_BASELINE
    case VectorLevel::baseline:
      return &baseline_kernels();
#endif
    default:
      return nullptr;
  }
}

std::string compiled_level_names() {
  std::string names;
  for (int level = 0; level < static_cast<int>(std::size(kVectorLevelNames)); ++level) {
    if (compiled_level(static_cast<VectorLevel>(level)) == nullptr) continue;
    names += names.empty() ? "" : ", ";
    names += kVectorLevelNames[level];
  }
  return names.empty() ? "none" : names;
}

// The widest level at or below the processor's that this library holds, or -1.
int running_level() {
  for (int level = static_cast<int>(processor_level()); level >= 0; --level) {
    if (compiled_level(static_cast<VectorLevel>(level)) != nullptr) return level;
  }
  return -1;
}

const StorageKernels<float>& of_storage(const LevelKernels& table, float*) { return table.f32; }
const StorageKernels<double>& of_storage(const LevelKernels& table, double*) { return table.f64; }
const StorageKernels<c10::Half>& of_storage(const LevelKernels& table, c10::Half*) { return table.f16; }
const StorageKernels<c10::BFloat16>& of_storage(const LevelKernels& table, c10::BFloat16*) { return table.bf16; }

template <typename T, typename A>
BlockRange<ForwardArgs<T, A>> pass_entry(const StorageKernels<T>& kernels, const ForwardArgs<T, A>&, int64_t k) {
  return kernels.forward[k - 3];
}

template <typename T, typename A>
BlockRange<BackwardArgs<T, A>> pass_entry(const StorageKernels<T>& kernels, const BackwardArgs<T, A>&, int64_t k) {
  return kernels.backward[k - 3];
}

// The storage type of ForwardArgs<T, A> or BackwardArgs<T, A>.
template <typename Args>
using storage_of = std::remove_const_t<std::remove_pointer_t<decltype(Args::U)>>;

// The entry point of one pass for the call's storage type and k: the widest level at or
// below the processor's that this library holds and that has code for the storage type.
template <typename Args>
BlockRange<Args> level_entry(const Args& args, int64_t k) {
  for (int level = running_level(); level >= 0; --level) {
    const LevelKernels* table = compiled_level(static_cast<VectorLevel>(level));
    if (table == nullptr) continue;
    const BlockRange<Args> entry = pass_entry(of_storage(*table, static_cast<storage_of<Args>*>(nullptr)), args, k);
    if (entry != nullptr) return entry;
  }
  TORCH_CHECK(false, "sru_lightning: this CPU kernel library holds the vector levels ", compiled_level_names(),
              " and none of them runs on this processor (", kVectorLevelNames[static_cast<int>(processor_level())],
              "); `python -m sru_lightning build` builds the level it needs");
}

// Splits the blocks over the threads; each range runs the entry point of the widest vector
// level this processor allows.
template <typename Args>
void run_blocks(const RecurrenceDims& dims, const Args& a) {
  const BlockRange<Args> entry = level_entry(a, dims.k);
  at::parallel_for(0, cpu_blocks::task_count(dims), 1,
                   [&](int64_t begin, int64_t end) { entry(dims, a, begin, end); });
}

}  // namespace

int64_t cpu_vector_level() {
  return running_level();
}

std::vector<std::string> cpu_vector_levels() {
  return {std::begin(kVectorLevelNames), std::end(kVectorLevelNames)};
}

void recurrence_forward_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_boxed(op, stack, [](const CallArguments& call) {
    return recurrence_forward_impl(call, [](const RecurrenceDims& dims, const auto& args) { run_blocks(dims, args); });
  });
}

void recurrence_backward_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_boxed(op, stack, [](const CallArguments& call) {
    return recurrence_backward_impl(call, [](const RecurrenceDims& dims, const auto& args) { run_blocks(dims, args); });
  });
}

}  // namespace sru_lightning
