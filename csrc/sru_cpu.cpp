// CPU kernels of the SRU recurrence. Columns are grouped in blocks (one batch element, one
// direction, up to kBlock hidden units) and at::parallel_for hands each thread a contiguous
// range of blocks. A thread keeps the state of up to kChunkBlocks blocks and runs the time
// loop over them step by step, so each step streams a long contiguous stretch of U, x and
// h. Per block and step, the inputs are gathered into small float arrays (half storage is
// widened with vector conversions), the step math of sru_step.h runs over them in one
// branch-free loop the compiler vectorizes, and the results are narrowed back to the
// storage type on store. The block loops live in sru_cpu_blocks.h.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "sru_ops.h"

// The block loops are compiled once per vector level (baseline x86-64; AVX2+FMA+F16C;
// AVX-512; AVX-512 with the BF16 conversion instructions) and the widest one the processor
// supports is picked at run time, so the JIT-built library runs on any machine sharing the
// extension cache and still uses wide vectors where they exist.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SRU_X86_LEVELS 1
#include <immintrin.h>
#define SRU_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SRU_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma,f16c")))
#define SRU_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16,avx2,fma,f16c")))
#endif
#define SRU_ALWAYS_INLINE inline __attribute__((always_inline))

namespace sru_lightning {

namespace {

constexpr int64_t kBlock = 64;
// Blocks whose state a thread keeps at once (128 * 64 columns): the per-block state stays
// in L2 while each step still streams long contiguous stretches of memory.
constexpr int64_t kChunkBlocks = 128;
// How many blocks ahead the block loops prefetch their inputs.
constexpr int64_t kPrefetchBlocks = 2;

// In the order of cpu_vector_level()'s numbers and of kVectorLevelNames; each level needs
// the previous one.
enum class VectorLevel { baseline, avx2, avx512, avx512_bf16 };
// The names Python reads (cpu_vector_levels) and SRU_LIGHTNING_CPU_VECTORS accepts.
constexpr const char* kVectorLevelNames[] = {"baseline", "avx2", "avx512", "avx512_bf16"};
static_assert(std::size(kVectorLevelNames) == static_cast<size_t>(VectorLevel::avx512_bf16) + 1,
              "one name per vector level");

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
VectorLevel vector_level() {
#ifdef SRU_X86_LEVELS
  static const VectorLevel level = [] {
    __builtin_cpu_init();
    VectorLevel supported = VectorLevel::baseline;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      supported = VectorLevel::avx2;
    }
    if (supported == VectorLevel::avx2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vl")) {
      supported = VectorLevel::avx512;
    }
    if (supported == VectorLevel::avx512 && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512bf16")) {
      supported = VectorLevel::avx512_bf16;
    }
    return std::min(supported, level_cap());
  }();
  return level;
#else
  return VectorLevel::baseline;
#endif
}

// Position of a block of columns: batch b, direction d, hidden units [j0, j0 + n).
struct ColumnBlock {
  int64_t b, d, n;
  int64_t column;  // offset in a (B, dirs*D) tensor (h and c at one step)
  int64_t weight;  // offset in a (dirs, D) half of weight_c or bias
};

ColumnBlock block_at(const RecurrenceDims& dims, int64_t task) {
  const int64_t blocks_per_row = (dims.hidden + kBlock - 1) / kBlock;
  const int64_t row = task / blocks_per_row;  // b * dirs + d
  const int64_t j0 = (task % blocks_per_row) * kBlock;
  ColumnBlock block;
  block.b = row / dims.directions;
  block.d = row % dims.directions;
  block.n = std::min(kBlock, dims.hidden - j0);
  block.column = row * dims.hidden + j0;
  block.weight = block.d * dims.hidden + j0;
  return block;
}

// Thread-local storage of `fields` arrays of kBlock values for each of `blocks` blocks.
template <typename A>
class BlockArena {
 public:
  // Uninitialized: every field is filled before it is read.
  BlockArena(int64_t blocks, int fields) : fields_(fields), values_(new A[blocks * fields * kBlock]) {}
  A* get(int64_t block, int field) { return values_.get() + (block * fields_ + field) * kBlock; }

 private:
  int fields_;
  std::unique_ptr<A[]> values_;
};

// The fields of a block in a pass's arena. Both passes: the carried state (c forward, grad_c
// backward) and the constants of every step. Backward also: the running sums of the wf, wr,
// bf and br gradients, in that order and adjacent (backward_loop takes them as one array).
enum ArenaField : int {
  kState,
  kForgetBias,
  kResetBias,
  kForgetWeight,
  kResetWeight,
  kMask,
  kForwardFields,
  kForgetWeightSum = kForwardFields,
  kResetWeightSum,
  kForgetBiasSum,
  kResetBiasSum,
  kBackwardFields,
};

int64_t task_count(const RecurrenceDims& dims) {
  return dims.batch * dims.directions * ((dims.hidden + kBlock - 1) / kBlock);
}

// The block loops at each vector level, in namespaces of their own (see sru_cpu_blocks.h).
#define SRU_LEVEL_ID 0
#define SRU_LEVEL_TARGET
namespace level_baseline {
#include "sru_cpu_blocks.h"
}  // namespace level_baseline
#undef SRU_LEVEL_ID
#undef SRU_LEVEL_TARGET

#ifdef SRU_X86_LEVELS
#define SRU_LEVEL_ID 1
#define SRU_LEVEL_TARGET SRU_TARGET_AVX2
namespace level_avx2 {
#include "sru_cpu_blocks.h"
}  // namespace level_avx2
#undef SRU_LEVEL_ID
#undef SRU_LEVEL_TARGET

#define SRU_LEVEL_ID 2
#define SRU_LEVEL_TARGET SRU_TARGET_AVX512
namespace level_avx512 {
#include "sru_cpu_blocks.h"
}  // namespace level_avx512
#undef SRU_LEVEL_ID
#undef SRU_LEVEL_TARGET

#define SRU_LEVEL_ID 3
#define SRU_LEVEL_TARGET SRU_TARGET_AVX512_BF16
namespace level_avx512_bf16 {
#include "sru_cpu_blocks.h"
}  // namespace level_avx512_bf16
#undef SRU_LEVEL_ID
#undef SRU_LEVEL_TARGET
#endif

template <typename Args>
using BlockRange = void (*)(const RecurrenceDims&, const Args&, int64_t, int64_t);

// The storage type of ForwardArgs<T, A> or BackwardArgs<T, A>.
template <typename Args>
using storage_of = std::remove_const_t<std::remove_pointer_t<decltype(Args::U)>>;

// The entry point of one pass at a vector level, for the call's k.
template <typename Args, int K>
BlockRange<Args> level_entry(VectorLevel level) {
  using T = storage_of<Args>;
#ifdef SRU_X86_LEVELS
  switch (level) {
    case VectorLevel::avx512_bf16:
      // Only the narrowing of bfloat16 differs from the AVX-512 code: other storage types
      // share that code rather than compile it twice.
      if constexpr (std::is_same_v<T, c10::BFloat16>) return &level_avx512_bf16::blocks_range<T, K>;
      return &level_avx512::blocks_range<T, K>;
    case VectorLevel::avx512:
      return &level_avx512::blocks_range<T, K>;
    case VectorLevel::avx2:
      return &level_avx2::blocks_range<T, K>;
    case VectorLevel::baseline:
      break;
  }
#endif
  (void)level;
  return &level_baseline::blocks_range<T, K>;
}

// Splits the blocks over the threads; each range runs the entry point of the widest vector
// level this processor allows.
template <typename Args>
void run_blocks(const RecurrenceDims& dims, const Args& a) {
  const VectorLevel level = vector_level();
  const BlockRange<Args> entry = dims.k == 3 ? level_entry<Args, 3>(level) : level_entry<Args, 4>(level);
  at::parallel_for(0, task_count(dims), 1,
                   [&](int64_t begin, int64_t end) { entry(dims, a, begin, end); });
}

}  // namespace

int64_t cpu_vector_level() {
  return static_cast<int64_t>(vector_level());
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
