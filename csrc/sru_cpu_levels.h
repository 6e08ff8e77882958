// What the CPU kernels' files share: the vector levels, the table of entry points each level
// file fills (sru_cpu_<level>.cpp), and the blocks of columns the block loops walk.
//
// Each vector level is its own translation unit, so a build compiles the levels in parallel,
// and a library holds only the levels it was built with: SRU_CPU_WITH_<LEVEL> is defined for
// each (sru_lightning/ops/build.py picks them: the levels this processor runs, or all of them
// for a cache shared by machines with different processors). sru_cpu.cpp runs the widest
// level the library holds that the processor supports.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <type_traits>

#include "sru_ops.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SRU_X86_LEVELS 1
#include <immintrin.h>
#define SRU_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SRU_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx2,fma,f16c")))
#define SRU_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16,avx2,fma,f16c")))
#endif
#define SRU_ALWAYS_INLINE inline __attribute__((always_inline))

namespace sru_lightning {

// In the order of cpu_vector_level()'s numbers and of kVectorLevelNames; each level needs
// the previous one.
enum class VectorLevel { baseline, avx2, avx512, avx512_bf16 };
// The names Python reads (cpu_vector_levels) and SRU_LIGHTNING_CPU_VECTORS accepts.
inline constexpr const char* kVectorLevelNames[] = {"baseline", "avx2", "avx512", "avx512_bf16"};
static_assert(std::size(kVectorLevelNames) == static_cast<size_t>(VectorLevel::avx512_bf16) + 1,
              "one name per vector level");

// A thread's range of blocks of one pass.
template <typename Args>
using BlockRange = void (*)(const RecurrenceDims&, const Args&, int64_t, int64_t);

// The entry points of one storage type at one level, indexed by k - 3; null where the level
// leaves that type to the level below it.
template <typename T>
struct StorageKernels {
  BlockRange<ForwardArgs<T, accumulate_t<T>>> forward[2] = {};
  BlockRange<BackwardArgs<T, accumulate_t<T>>> backward[2] = {};
};

struct LevelKernels {
  StorageKernels<float> f32;
  StorageKernels<double> f64;
  StorageKernels<c10::Half> f16;
  StorageKernels<c10::BFloat16> bf16;
};

// Defined by the level files this library was built with.
const LevelKernels& baseline_kernels();
const LevelKernels& avx2_kernels();
const LevelKernels& avx512_kernels();
const LevelKernels& avx512_bf16_kernels();

namespace cpu_blocks {

inline constexpr int64_t kBlock = 64;
// Blocks whose state a thread keeps at once (128 * 64 columns): the per-block state stays
// in L2 while each step still streams long contiguous stretches of memory.
inline constexpr int64_t kChunkBlocks = 128;
// How many blocks ahead the block loops prefetch their inputs.
inline constexpr int64_t kPrefetchBlocks = 2;

// Position of a block of columns: batch b, direction d, hidden units [j0, j0 + n).
struct ColumnBlock {
  int64_t b, d, n;
  int64_t column;  // offset in a (B, dirs*D) tensor (h and c at one step)
  int64_t weight;  // offset in a (dirs, D) half of weight_c or bias
};

inline ColumnBlock block_at(const RecurrenceDims& dims, int64_t task) {
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

inline int64_t task_count(const RecurrenceDims& dims) {
  return dims.batch * dims.directions * ((dims.hidden + kBlock - 1) / kBlock);
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

}  // namespace cpu_blocks
}  // namespace sru_lightning
