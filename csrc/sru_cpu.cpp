// CPU kernels of the SRU recurrence. Columns are grouped in blocks (one batch element, one
// direction, up to kBlock hidden units) and at::parallel_for hands each thread a contiguous
// range of blocks. A thread keeps the state of up to kChunkBlocks blocks and runs the time
// loop over them step by step, so each step streams a long contiguous stretch of U, x and
// h. Per block and step, the inputs are gathered into small float arrays, the step math of
// sru_step.h runs over them in one branch-free loop the compiler vectorizes, and the
// results are scattered back in the storage type.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "sru_ops.h"

namespace sru_lightning {

namespace {

constexpr int64_t kBlock = 64;
// Blocks whose state a thread keeps at once (128 * 64 columns): the per-block state stays
// in L2 while each step still streams long contiguous stretches of memory.
constexpr int64_t kChunkBlocks = 128;

// The block loops are compiled three times (baseline x86-64, AVX2+FMA, AVX-512+FMA) and the
// widest one the processor supports is picked at run time, so the JIT-built library runs on
// any machine sharing the extension cache and still uses wide vectors where they exist.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SRU_X86_LEVELS 1
#define SRU_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define SRU_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#endif
#define SRU_ALWAYS_INLINE inline __attribute__((always_inline))

enum class VectorLevel { baseline, avx2, avx512 };

// The widest level this processor supports; SRU_LIGHTNING_CPU_VECTORS=baseline|avx2 caps it
// (to test every path on one machine, or to rule the wide paths out when debugging).
VectorLevel vector_level() {
#ifdef SRU_X86_LEVELS
  static const VectorLevel level = [] {
    __builtin_cpu_init();
    VectorLevel supported = VectorLevel::baseline;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) supported = VectorLevel::avx2;
    if (supported == VectorLevel::avx2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vl")) {
      supported = VectorLevel::avx512;
    }
    const char* cap = std::getenv("SRU_LIGHTNING_CPU_VECTORS");
    if (cap != nullptr && std::strcmp(cap, "baseline") == 0) return VectorLevel::baseline;
    if (cap != nullptr && std::strcmp(cap, "avx2") == 0 && supported == VectorLevel::avx512) {
      return VectorLevel::avx2;
    }
    return supported;
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

int64_t task_count(const RecurrenceDims& dims) {
  return dims.batch * dims.directions * ((dims.hidden + kBlock - 1) / kBlock);
}

template <typename T, typename A>
inline void gather_weights(const T* __restrict__ pairs, int64_t n, A* __restrict__ wf,
                           A* __restrict__ wr) {
  for (int64_t i = 0; i < n; ++i) {
    wf[i] = static_cast<A>(pairs[2 * i]);
    wr[i] = static_cast<A>(pairs[2 * i + 1]);
  }
}

template <typename T, typename A>
inline void load(const T* __restrict__ source, int64_t n, A* __restrict__ target, A fallback) {
  if (source == nullptr) {
    for (int64_t i = 0; i < n; ++i) target[i] = fallback;
  } else {
    for (int64_t i = 0; i < n; ++i) target[i] = static_cast<A>(source[i]);
  }
}

template <typename T, typename A>
inline void store(const A* __restrict__ source, int64_t n, T* __restrict__ target) {
  for (int64_t i = 0; i < n; ++i) target[i] = static_cast<T>(source[i]);
}

// Arena fields 1 to 5 of a block hold what both passes read at every step: the bias halves
// bf and br, the vector weight_c halves wf and wr (a per-step weight_c is gathered into them
// each step instead) and mask_c. Field 0 is the state each pass carries.
template <typename T, typename A>
SRU_ALWAYS_INLINE void load_block_constants(const RecurrenceDims& dims, const RecurrenceInputs<T, A>& a,
                                            const ColumnBlock& blk, BlockArena<A>& arena, int64_t slot) {
  const int64_t width = dims.directions * dims.hidden;
  load(a.bias + blk.weight, blk.n, arena.get(slot, 1), A(0));
  load(a.bias + width + blk.weight, blk.n, arena.get(slot, 2), A(0));
  if (!dims.per_step_weight_c) {
    load(a.weight_c + blk.weight, blk.n, arena.get(slot, 3), A(0));
    load(a.weight_c + width + blk.weight, blk.n, arena.get(slot, 4), A(0));
  }
  load(a.mask_c == nullptr ? nullptr : a.mask_c + blk.column, blk.n, arena.get(slot, 5), A(1));
}

// One step's inputs of a block besides U, read the same way by both passes: the skip term
// (zeros without one) and, for a per-step weight_c, this step's weights. U itself is read
// inside the step loops.
template <typename T, typename A, int K>
SRU_ALWAYS_INLINE void gather_step(const RecurrenceDims& dims, const RecurrenceInputs<T, A>& a,
                                   int64_t offset, int64_t n, A scale, A* __restrict__ skip,
                                   A* __restrict__ wf, A* __restrict__ wr) {
  if (dims.skip_from_u) {
    const T* __restrict__ u = a.U + offset * K;
    for (int64_t i = 0; i < n; ++i) skip[i] = static_cast<A>(u[i * K + K - 1]);
  } else if (dims.skip_from_x) {
    const T* __restrict__ x = a.x + offset;
    for (int64_t i = 0; i < n; ++i) skip[i] = static_cast<A>(x[i]) * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) skip[i] = A(0);  // no skip term: h = c * r * mask
  }
  if (dims.per_step_weight_c) gather_weights(a.weight_c + offset * 2, n, wf, wr);
}

// The forward step over one block: reads U, writes h, updates the state c in place.
template <typename T, int K>
SRU_ALWAYS_INLINE void forward_loop(int64_t n, const T* __restrict__ u, const accumulate_t<T>* __restrict__ skip,
                                    const accumulate_t<T>* __restrict__ wf, const accumulate_t<T>* __restrict__ wr,
                                    const accumulate_t<T>* __restrict__ bf, const accumulate_t<T>* __restrict__ br,
                                    const accumulate_t<T>* __restrict__ mask, accumulate_t<T>* __restrict__ c,
                                    T* __restrict__ h) {
  using A = accumulate_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    A c_new, h_new;
    forward_step<A>(static_cast<A>(u[i * K]), static_cast<A>(u[i * K + 1]), static_cast<A>(u[i * K + 2]), skip[i],
                    wf[i], wr[i], bf[i], br[i], mask[i], c[i], c_new, h_new);
    c[i] = c_new;
    h[i] = static_cast<T>(h_new);
  }
}

// One forward step of one block. N is the block width when it is known at compile time
// (every block of a layer whose hidden size is a multiple of kBlock), 0 for a runtime width,
// so the common case compiles to loops of a fixed trip count.
template <typename T, int K, int N>
SRU_ALWAYS_INLINE void forward_block_step(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& a,
                                          const ColumnBlock& blk, int64_t offset, accumulate_t<T> scale,
                                          BlockArena<accumulate_t<T>>& arena, int64_t slot) {
  using A = accumulate_t<T>;
  const int64_t n = N > 0 ? N : blk.n;
  alignas(64) A skip[kBlock];
  A* c = arena.get(slot, 0);
  A* wf = arena.get(slot, 3);
  A* wr = arena.get(slot, 4);
  gather_step<T, A, K>(dims, a, offset, n, scale, skip, wf, wr);
  forward_loop<T, K>(n, a.U + offset * K, skip, wf, wr, arena.get(slot, 1), arena.get(slot, 2),
                     arena.get(slot, 5), c, a.h + offset);
  if (a.c_all != nullptr) store(c, n, a.c_all + offset);
}

template <typename T, int K>
SRU_ALWAYS_INLINE void forward_blocks(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& a,
                                   int64_t begin, int64_t end) {
  using A = accumulate_t<T>;
  const int64_t columns = dims.columns();
  const A scale = a.scale();
  // Per-block state and constants of this thread's blocks, kBlock values per block each.
  BlockArena<A> arena(end - begin, 6);
  for (int64_t task = begin; task < end; ++task) {
    const ColumnBlock blk = block_at(dims, task);
    load(a.c0 == nullptr ? nullptr : a.c0 + blk.column, blk.n, arena.get(task - begin, 0), A(0));
    load_block_constants(dims, a, blk, arena, task - begin);
  }

  // Step-major: each step walks this thread's contiguous columns, so memory is streamed.
  for (int64_t step = 0; step < dims.length; ++step) {
    for (int64_t task = begin; task < end; ++task) {
      const ColumnBlock blk = block_at(dims, task);
      const int64_t slot = task - begin;
      const int64_t t = dims.time_of(step, blk.d);
      const int64_t offset = t * columns + blk.column;
      if (a.mask_pad != nullptr && a.mask_pad[t * dims.batch + blk.b]) {
        // Padding: the state is carried over and the output is zero.
        for (int64_t i = 0; i < blk.n; ++i) a.h[offset + i] = static_cast<T>(A(0));
        if (a.c_all != nullptr) store(arena.get(slot, 0), blk.n, a.c_all + offset);
      } else if (blk.n == kBlock) {
        forward_block_step<T, K, kBlock>(dims, a, blk, offset, scale, arena, slot);
      } else {
        forward_block_step<T, K, 0>(dims, a, blk, offset, scale, arena, slot);
      }
    }
  }
  for (int64_t task = begin; task < end; ++task) {
    const ColumnBlock blk = block_at(dims, task);
    store(arena.get(task - begin, 0), blk.n, a.c_last + blk.column);
  }
}

// The backward step over one block: reads U, c_{t-1} and grad_h, writes grad_U's first three
// values per column, carries grad_c and the weight_c/bias gradient sums, and leaves the
// gradients of the skip term and of a per-step weight_c in g_skip, g_wf and g_wr.
template <typename T, int K>
SRU_ALWAYS_INLINE void backward_loop(
    int64_t n, const T* __restrict__ u, const accumulate_t<T>* __restrict__ skip,
    const accumulate_t<T>* __restrict__ wf, const accumulate_t<T>* __restrict__ wr,
    const accumulate_t<T>* __restrict__ bf, const accumulate_t<T>* __restrict__ br,
    const accumulate_t<T>* __restrict__ mask, const accumulate_t<T>* __restrict__ c_prev,
    const T* __restrict__ grad_h, accumulate_t<T>* __restrict__ grad_c, T* __restrict__ grad_u,
    accumulate_t<T>* __restrict__ g_skip, accumulate_t<T>* __restrict__ g_wf, accumulate_t<T>* __restrict__ g_wr,
    accumulate_t<T>* __restrict__ sums) {
  using A = accumulate_t<T>;
  A* __restrict__ sum_wf = sums;
  A* __restrict__ sum_wr = sums + kBlock;
  A* __restrict__ sum_bf = sums + 2 * kBlock;
  A* __restrict__ sum_br = sums + 3 * kBlock;
  for (int64_t i = 0; i < n; ++i) {
    StepGradients<A> g;
    backward_step<A>(static_cast<A>(u[i * K]), static_cast<A>(u[i * K + 1]), static_cast<A>(u[i * K + 2]), skip[i],
                     wf[i], wr[i], bf[i], br[i], mask[i], c_prev[i], static_cast<A>(grad_h[i]), grad_c[i], g);
    grad_c[i] = g.c_prev;
    grad_u[i * K] = static_cast<T>(g.u0);
    grad_u[i * K + 1] = static_cast<T>(g.u1);
    grad_u[i * K + 2] = static_cast<T>(g.u2);
    g_skip[i] = g.skip;
    g_wf[i] = g.wf;
    g_wr[i] = g.wr;
    sum_wf[i] += g.wf;
    sum_wr[i] += g.wr;
    sum_bf[i] += g.u1;
    sum_br[i] += g.u2;
  }
}

// One backward step of one block; N as in forward_block_step.
template <typename T, int K, int N>
SRU_ALWAYS_INLINE void backward_block_step(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& a,
                                           const ColumnBlock& blk, int64_t step, accumulate_t<T> scale,
                                           BlockArena<accumulate_t<T>>& arena, int64_t slot) {
  using A = accumulate_t<T>;
  const int64_t n = N > 0 ? N : blk.n;
  const int64_t columns = dims.columns();
  const int64_t offset = dims.time_of(step, blk.d) * columns + blk.column;
  alignas(64) A c_prev[kBlock], skip[kBlock], g_skip[kBlock], g_wf[kBlock], g_wr[kBlock];
  A* wf = arena.get(slot, 3);
  A* wr = arena.get(slot, 4);
  if (step > 0) {
    load(a.c_all + dims.time_of(step - 1, blk.d) * columns + blk.column, n, c_prev, A(0));
  } else {
    load(a.c0 == nullptr ? nullptr : a.c0 + blk.column, n, c_prev, A(0));
  }
  gather_step<T, A, K>(dims, a, offset, n, scale, skip, wf, wr);
  T* grad_u = a.grad_U + offset * K;
  backward_loop<T, K>(n, a.U + offset * K, skip, wf, wr, arena.get(slot, 1), arena.get(slot, 2),
                      arena.get(slot, 5), c_prev, a.grad_h + offset, arena.get(slot, 0), grad_u, g_skip,
                      g_wf, g_wr, arena.get(slot, 6));
  if (K == 4) {
    for (int64_t i = 0; i < n; ++i) grad_u[i * K + 3] = static_cast<T>(dims.skip_from_u ? g_skip[i] : A(0));
  }
  if (a.grad_x != nullptr) {
    T* __restrict__ grad_x = a.grad_x + offset;
    for (int64_t i = 0; i < n; ++i) grad_x[i] = static_cast<T>(g_skip[i] * scale);
  }
  if (a.grad_weight_c != nullptr) {
    T* __restrict__ pairs = a.grad_weight_c + offset * 2;
    for (int64_t i = 0; i < n; ++i) {
      pairs[2 * i] = static_cast<T>(g_wf[i]);
      pairs[2 * i + 1] = static_cast<T>(g_wr[i]);
    }
  }
}

template <typename T, int K>
SRU_ALWAYS_INLINE void backward_blocks(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& a,
                                    int64_t begin, int64_t end) {
  using A = accumulate_t<T>;
  const int64_t columns = dims.columns();
  const int64_t width = dims.directions * dims.hidden;
  const A scale = a.scale();
  // Per block: grad_c, bf, br, wf, wr, mask, and the sums of wf, wr, bf, br gradients.
  BlockArena<A> arena(end - begin, 10);
  for (int64_t task = begin; task < end; ++task) {
    const ColumnBlock blk = block_at(dims, task);
    const int64_t slot = task - begin;
    load(a.grad_c_last == nullptr ? nullptr : a.grad_c_last + blk.column, blk.n, arena.get(slot, 0), A(0));
    load_block_constants(dims, a, blk, arena, slot);
    for (int field = 6; field < 10; ++field) load<T, A>(nullptr, kBlock, arena.get(slot, field), A(0));
  }

  for (int64_t step = dims.length - 1; step >= 0; --step) {
    for (int64_t task = begin; task < end; ++task) {
      const ColumnBlock blk = block_at(dims, task);
      const int64_t slot = task - begin;
      const int64_t t = dims.time_of(step, blk.d);
      if (a.mask_pad != nullptr && a.mask_pad[t * dims.batch + blk.b]) {
        // Padding passed c through unchanged and emitted h = 0: only grad_c flows on.
        const int64_t offset = t * columns + blk.column;
        for (int64_t i = 0; i < blk.n * K; ++i) a.grad_U[offset * K + i] = static_cast<T>(A(0));
        if (a.grad_x != nullptr)
          for (int64_t i = 0; i < blk.n; ++i) a.grad_x[offset + i] = static_cast<T>(A(0));
        if (a.grad_weight_c != nullptr)
          for (int64_t i = 0; i < 2 * blk.n; ++i) a.grad_weight_c[offset * 2 + i] = static_cast<T>(A(0));
      } else if (blk.n == kBlock) {
        backward_block_step<T, K, kBlock>(dims, a, blk, step, scale, arena, slot);
      } else {
        backward_block_step<T, K, 0>(dims, a, blk, step, scale, arena, slot);
      }
    }
  }
  for (int64_t task = begin; task < end; ++task) {
    const ColumnBlock blk = block_at(dims, task);
    const int64_t slot = task - begin;
    store(arena.get(slot, 0), blk.n, a.grad_c0 + blk.column);
    A* bias_row = a.bias_partials + blk.b * 2 * width;
    std::copy(arena.get(slot, 8), arena.get(slot, 8) + blk.n, bias_row + blk.weight);
    std::copy(arena.get(slot, 9), arena.get(slot, 9) + blk.n, bias_row + width + blk.weight);
    if (a.weight_c_partials != nullptr) {
      A* weight_row = a.weight_c_partials + blk.b * 2 * width;
      std::copy(arena.get(slot, 6), arena.get(slot, 6) + blk.n, weight_row + blk.weight);
      std::copy(arena.get(slot, 7), arena.get(slot, 7) + blk.n, weight_row + width + blk.weight);
    }
  }
}

// One entry point per vector level: the same inlined body, compiled for each target. Each
// runs a thread's range of blocks in chunks of kChunkBlocks.
#define SRU_LEVEL_ENTRY(name, body, Args, attributes)                                          \
  template <typename T, int K>                                                                 \
  attributes void name(const RecurrenceDims& dims, const Args<T, accumulate_t<T>>& a,          \
                       int64_t begin, int64_t end) {                                           \
    for (int64_t first = begin; first < end; first += kChunkBlocks) {                          \
      body<T, K>(dims, a, first, std::min(end, first + kChunkBlocks));                         \
    }                                                                                          \
  }

template <typename Args>
using BlockRange = void (*)(const RecurrenceDims&, const Args&, int64_t, int64_t);

// The entry points of one block body at every vector level, for the call's k.
template <typename Args>
struct LevelEntries {
  BlockRange<Args> baseline, avx2, avx512;
};

// The wide levels' entry points; without the x86 levels they name the baseline code.
#ifdef SRU_X86_LEVELS
#define SRU_WIDE_ENTRY(name, body, Args, attributes) SRU_LEVEL_ENTRY(name, body, Args, attributes)
#else
#define SRU_WIDE_ENTRY(name, body, Args, attributes) \
  template <typename T, int K>                       \
  constexpr BlockRange<Args<T, accumulate_t<T>>> name = body##_baseline<T, K>;
#endif

// Defines the level entry points of `body` and level_entries(Args, k), which picks them by
// the argument type, so forward and backward share run_blocks.
#define SRU_LEVEL_ENTRIES(body, Args)                                                   \
  SRU_LEVEL_ENTRY(body##_baseline, body, Args, )                                        \
  SRU_WIDE_ENTRY(body##_avx2, body, Args, SRU_TARGET_AVX2)                              \
  SRU_WIDE_ENTRY(body##_avx512, body, Args, SRU_TARGET_AVX512)                          \
  template <typename T, typename A>                                                     \
  LevelEntries<Args<T, A>> level_entries(const Args<T, A>&, int64_t k) {                \
    if (k == 3) return {body##_baseline<T, 3>, body##_avx2<T, 3>, body##_avx512<T, 3>}; \
    return {body##_baseline<T, 4>, body##_avx2<T, 4>, body##_avx512<T, 4>};             \
  }

SRU_LEVEL_ENTRIES(forward_blocks, ForwardArgs)
SRU_LEVEL_ENTRIES(backward_blocks, BackwardArgs)

// Splits the blocks over the threads; each range runs the entry point of the widest vector
// level this processor allows.
template <typename Args>
void run_blocks(const RecurrenceDims& dims, const Args& a) {
  const LevelEntries<Args> entries = level_entries(a, dims.k);
  const VectorLevel level = vector_level();
  const BlockRange<Args> entry = level == VectorLevel::avx512 ? entries.avx512
                                 : level == VectorLevel::avx2 ? entries.avx2
                                                              : entries.baseline;
  at::parallel_for(0, task_count(dims), 1,
                   [&](int64_t begin, int64_t end) { entry(dims, a, begin, end); });
}

}  // namespace

int64_t cpu_vector_level() {
  return static_cast<int64_t>(vector_level());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrence_forward_cpu(
    const at::Tensor& U, const OptionalTensor& x, const at::Tensor& weight_c,
    const at::Tensor& bias, const OptionalTensor& c0, const OptionalTensor& scale_x,
    double scale_x_value, const OptionalTensor& mask_c, const OptionalTensor& mask_pad,
    bool bidirectional, bool has_skip_term, bool store_c) {
  return recurrence_forward_impl(U, x, weight_c, bias, c0, scale_x, scale_x_value, mask_c, mask_pad,
                                 bidirectional, has_skip_term, store_c,
                                 [](const RecurrenceDims& dims, const auto& args) { run_blocks(dims, args); });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> recurrence_backward_cpu(
    const at::Tensor& grad_h, const OptionalTensor& grad_c_last, const at::Tensor& U,
    const OptionalTensor& x, const at::Tensor& weight_c, const at::Tensor& bias,
    const OptionalTensor& c0, const OptionalTensor& scale_x, double scale_x_value,
    const OptionalTensor& mask_c, const OptionalTensor& mask_pad, const at::Tensor& c_all,
    bool bidirectional, bool has_skip_term) {
  return recurrence_backward_impl(grad_h, grad_c_last, U, x, weight_c, bias, c0, scale_x,
                                  scale_x_value, mask_c, mask_pad, c_all, bidirectional,
                                  has_skip_term,
                                  [](const RecurrenceDims& dims, const auto& args) { run_blocks(dims, args); });
}

}  // namespace sru_lightning
