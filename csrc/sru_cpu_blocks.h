// The block loops of the CPU kernels at one vector level and the level's table of entry
// points. Each level file (sru_cpu_<level>.cpp) is its own translation unit and includes this
// file once, after sru_cpu_levels.h, with
//   SRU_LEVEL_ID       0 baseline, 1 AVX2+FMA+F16C, 2 AVX-512, 3 AVX-512 with BF16 conversions
//   SRU_LEVEL_TARGET   the function attribute compiling for that level (empty for baseline)
//   SRU_LEVEL_KERNELS  the name of the level's table function (sru_cpu_levels.h)
// Every function here carries the level's target, so the conversion intrinsics of the level
// inline into the loops (GCC refuses to inline a wider-target function into a plain one).
//
// Half storage (bf16, fp16): each block step widens its U, x, grad_h and per-step weight_c
// values into small float arrays (sru_cpu_conversions.h), runs the float loops of the float32 kernels over them
// (with the gate exponential matched to the storage's precision, see sru_step.h), and
// narrows h, c, the gradients on store. Float and double storage skip the copies.
//
// No include guard: the level file includes sru_cpu_levels.h first; this file includes only
// sru_cpu_conversions.h, which reads the same level macros.

namespace sru_lightning {
namespace {
namespace level {
using namespace cpu_blocks;

#define SRU_LEVEL_FN SRU_ALWAYS_INLINE SRU_LEVEL_TARGET

#include "sru_cpu_conversions.h"

// Asks for the cache lines of `count` values at `source` ahead of their use: each block
// step reads its inputs in one burst, too short for the hardware prefetcher to run ahead.
template <typename T>
SRU_LEVEL_FN void prefetch(const T* source, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(source);
  for (int64_t i = 0; i < count * static_cast<int64_t>(sizeof(T)); i += 64) __builtin_prefetch(bytes + i);
}

// Where the block kPrefetchBlocks after `task` at `step` lies in a pass's order (blocks
// within a step, then the next step: +1 forward, -1 backward): its block and step, or false
// past the pass's end.
SRU_LEVEL_FN bool block_ahead(const RecurrenceDims& dims, int64_t begin, int64_t end, int64_t task, int64_t step,
                              int64_t step_change, ColumnBlock& blk, int64_t& ahead_step) {
  int64_t ahead = task + kPrefetchBlocks;
  ahead_step = step;
  if (ahead >= end) {
    ahead = begin + (ahead - end) % (end - begin);
    ahead_step += step_change;
    if (ahead_step < 0 || ahead_step >= dims.length) return false;
  }
  blk = block_at(dims, ahead);
  return true;
}

// The arena fields kForgetBias to kMask of a block hold what both passes read at every step:
// the bias halves bf and br, the vector weight_c halves wf and wr (a per-step weight_c is
// gathered into them each step instead) and mask_c. kState is the state each pass carries.
template <typename T, typename A>
SRU_LEVEL_FN void load_block_constants(const RecurrenceDims& dims, const RecurrenceInputs<T, A>& a,
                                       const ColumnBlock& blk, BlockArena<A>& arena, int64_t slot) {
  const int64_t width = dims.directions * dims.hidden;
  load(a.bias + blk.weight, blk.n, arena.get(slot, kForgetBias), A(0));
  load(a.bias + width + blk.weight, blk.n, arena.get(slot, kResetBias), A(0));
  if (!dims.per_step_weight_c) {
    load(a.weight_c + blk.weight, blk.n, arena.get(slot, kForgetWeight), A(0));
    load(a.weight_c + width + blk.weight, blk.n, arena.get(slot, kResetWeight), A(0));
  }
  load(a.mask_c == nullptr ? nullptr : a.mask_c + blk.column, blk.n, arena.get(slot, kMask), A(1));
}

// One step's inputs of a block besides U, read the same way by both passes: the skip term
// (zeros without one) and, for a per-step weight_c, this step's weights. `u` is the block's
// U at this step in the accumulation type.
template <typename T, typename A, int K>
SRU_LEVEL_FN void gather_step(const RecurrenceDims& dims, const RecurrenceInputs<T, A>& a, const A* __restrict__ u,
                              int64_t offset, int64_t n, A scale, A* __restrict__ skip, A* __restrict__ wf,
                              A* __restrict__ wr) {
  if (dims.skip_from_u) {
    using Layout = ULayout<T, K>;
    for (int64_t i = 0; i < n; ++i) skip[i] = u[i * Layout::stride + (K - 1) * Layout::plane];
  } else if (dims.skip_from_x) {
    widen(a.x + offset, n, skip);
    for (int64_t i = 0; i < n; ++i) skip[i] *= scale;
  } else {
    for (int64_t i = 0; i < n; ++i) skip[i] = A(0);  // no skip term: h = c * r * mask
  }
  if (dims.per_step_weight_c) {
    alignas(64) A pair_scratch[2 * kBlock];
    const A* __restrict__ pairs = widened(a.weight_c + offset * 2, 2 * n, pair_scratch);
    for (int64_t i = 0; i < n; ++i) {
      wf[i] = pairs[2 * i];
      wr[i] = pairs[2 * i + 1];
    }
  }
}

// The forward step over one block in the accumulation type: reads U (value j of column i at
// u[i * S + j * P], see ULayout), writes h, updates the state c in place.
template <typename A, int S, int P, ExpAccuracy Accuracy>
SRU_LEVEL_FN void forward_loop(int64_t n, const A* __restrict__ u, const A* __restrict__ skip,
                               const A* __restrict__ wf, const A* __restrict__ wr, const A* __restrict__ bf,
                               const A* __restrict__ br, const A* __restrict__ mask, A* __restrict__ c,
                               A* __restrict__ h) {
  for (int64_t i = 0; i < n; ++i) {
    A c_new, h_new;
    forward_step<A, Accuracy>(u[i * S], u[i * S + P], u[i * S + 2 * P], skip[i], wf[i], wr[i], bf[i], br[i],
                              mask[i], c[i], c_new, h_new);
    c[i] = c_new;
    h[i] = h_new;
  }
}

// One forward step of one block. N is the block width when it is known at compile time
// (every block of a layer whose hidden size is a multiple of kBlock), 0 for a runtime width,
// so the common case compiles to loops of a fixed trip count.
template <typename T, int K, int N>
SRU_LEVEL_FN void forward_block_step(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& a,
                                     const ColumnBlock& blk, int64_t offset, accumulate_t<T> scale,
                                     BlockArena<accumulate_t<T>>& arena, int64_t slot) {
  using A = accumulate_t<T>;
  const int64_t n = N > 0 ? N : blk.n;
  alignas(64) A skip[kBlock], u_scratch[K * kBlock], h_scratch[kBlock];
  A* c = arena.get(slot, kState);
  A* wf = arena.get(slot, kForgetWeight);
  A* wr = arena.get(slot, kResetWeight);
  using Layout = ULayout<T, K>;
  const A* u = widened_u<T, K>(a.U + offset * K, n, u_scratch);
  gather_step<T, A, K>(dims, a, u, offset, n, scale, skip, wf, wr);
  A* h = output_buffer(a.h + offset, h_scratch);
  forward_loop<A, Layout::stride, Layout::plane, exp_accuracy<T>>(
      n, u, skip, wf, wr, arena.get(slot, kForgetBias), arena.get(slot, kResetBias), arena.get(slot, kMask), c, h);
  finish_output(h, n, a.h + offset);
  if (a.c_all != nullptr) store(c, n, a.c_all + offset);
}

template <typename T, int K>
SRU_LEVEL_FN void forward_blocks(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& a,
                                 int64_t begin, int64_t end) {
  using A = accumulate_t<T>;
  const int64_t columns = dims.columns();
  const A scale = a.scale();
  // Per-block state and constants of this thread's blocks, kBlock values per block each.
  BlockArena<A> arena(end - begin, kForwardFields);
  for (int64_t task = begin; task < end; ++task) {
    const ColumnBlock blk = block_at(dims, task);
    load(a.c0 == nullptr ? nullptr : a.c0 + blk.column, blk.n, arena.get(task - begin, kState), A(0));
    load_block_constants(dims, a, blk, arena, task - begin);
  }

  // Step-major: each step walks this thread's contiguous columns, so memory is streamed.
  for (int64_t step = 0; step < dims.length; ++step) {
    for (int64_t task = begin; task < end; ++task) {
      ColumnBlock next;
      int64_t next_step;
      if (block_ahead(dims, begin, end, task, step, 1, next, next_step)) {
        const int64_t next_offset = dims.time_of(next_step, next.d) * columns + next.column;
        prefetch(a.U + next_offset * K, next.n * K);
        if (dims.skip_from_x) prefetch(a.x + next_offset, next.n);
      }
      const ColumnBlock blk = block_at(dims, task);
      const int64_t slot = task - begin;
      const int64_t t = dims.time_of(step, blk.d);
      const int64_t offset = t * columns + blk.column;
      if (dims.restarts(a.reset, step, blk.d, blk.b)) {
        // A document starts: its state starts from c_starts at this step, or zero.
        load(a.c_starts == nullptr ? nullptr : a.c_starts + offset, blk.n, arena.get(slot, kState), A(0));
      }
      if (a.mask_pad != nullptr && a.mask_pad[t * dims.batch + blk.b]) {
        // Padding: the state is carried over and the output is zero.
        for (int64_t i = 0; i < blk.n; ++i) a.h[offset + i] = static_cast<T>(A(0));
        if (a.c_all != nullptr) store(arena.get(slot, kState), blk.n, a.c_all + offset);
      } else if (blk.n == kBlock) {
        forward_block_step<T, K, kBlock>(dims, a, blk, offset, scale, arena, slot);
      } else {
        forward_block_step<T, K, 0>(dims, a, blk, offset, scale, arena, slot);
      }
    }
  }
  for (int64_t task = begin; task < end; ++task) {
    const ColumnBlock blk = block_at(dims, task);
    store(arena.get(task - begin, kState), blk.n, a.c_last + blk.column);
  }
}

// The backward step over one block in the accumulation type: reads U and writes grad_U's
// first three values per column (both laid out as in forward_loop), reads c_{t-1} and grad_h,
// carries grad_c and the weight_c/bias gradient sums, and leaves the gradients of the skip term and of a per-step weight_c in
// g_skip, g_wf and g_wr.
template <typename A, int S, int P, ExpAccuracy Accuracy>
SRU_LEVEL_FN void backward_loop(int64_t n, const A* __restrict__ u, const A* __restrict__ skip,
                                const A* __restrict__ wf, const A* __restrict__ wr, const A* __restrict__ bf,
                                const A* __restrict__ br, const A* __restrict__ mask, const A* __restrict__ c_prev,
                                const A* __restrict__ grad_h, A* __restrict__ grad_c, A* __restrict__ grad_u,
                                A* __restrict__ g_skip, A* __restrict__ g_wf, A* __restrict__ g_wr,
                                A* __restrict__ sums) {
  A* __restrict__ sum_wf = sums;
  A* __restrict__ sum_wr = sums + kBlock;
  A* __restrict__ sum_bf = sums + 2 * kBlock;
  A* __restrict__ sum_br = sums + 3 * kBlock;
  for (int64_t i = 0; i < n; ++i) {
    StepGradients<A> g;
    backward_step<A, Accuracy>(u[i * S], u[i * S + P], u[i * S + 2 * P], skip[i], wf[i], wr[i], bf[i], br[i],
                               mask[i], c_prev[i], grad_h[i], grad_c[i], g);
    grad_c[i] = g.c_prev;
    grad_u[i * S] = g.u0;
    grad_u[i * S + P] = g.u1;
    grad_u[i * S + 2 * P] = g.u2;
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
SRU_LEVEL_FN void backward_block_step(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& a,
                                      const ColumnBlock& blk, int64_t step, accumulate_t<T> scale,
                                      BlockArena<accumulate_t<T>>& arena, int64_t slot) {
  using A = accumulate_t<T>;
  const int64_t n = N > 0 ? N : blk.n;
  const int64_t columns = dims.columns();
  const int64_t offset = dims.time_of(step, blk.d) * columns + blk.column;
  alignas(64) A c_prev[kBlock], skip[kBlock], g_skip[kBlock], g_wf[kBlock], g_wr[kBlock];
  alignas(64) A u_scratch[K * kBlock], grad_h_scratch[kBlock], grad_u_scratch[K * kBlock];
  A* wf = arena.get(slot, kForgetWeight);
  A* wr = arena.get(slot, kResetWeight);
  if (dims.restarts(a.reset, step, blk.d, blk.b)) {
    // a document's first step started from c_starts, or zero
    load(a.c_starts == nullptr ? nullptr : a.c_starts + offset, n, c_prev, A(0));
  } else if (step > 0) {
    load(a.c_all + dims.time_of(step - 1, blk.d) * columns + blk.column, n, c_prev, A(0));
  } else {
    load(a.c0 == nullptr ? nullptr : a.c0 + blk.column, n, c_prev, A(0));
  }
  using Layout = ULayout<T, K>;
  const A* u = widened_u<T, K>(a.U + offset * K, n, u_scratch);
  gather_step<T, A, K>(dims, a, u, offset, n, scale, skip, wf, wr);
  const A* grad_h = widened(a.grad_h + offset, n, grad_h_scratch);
  A* grad_u = output_buffer(a.grad_U + offset * K, grad_u_scratch);
  backward_loop<A, Layout::stride, Layout::plane, exp_accuracy<T>>(n, u, skip, wf, wr, arena.get(slot, kForgetBias),
                                       arena.get(slot, kResetBias), arena.get(slot, kMask), c_prev, grad_h,
                                       arena.get(slot, kState), grad_u, g_skip, g_wf, g_wr,
                                       arena.get(slot, kForgetWeightSum));
  if (K == 4) {
    for (int64_t i = 0; i < n; ++i) grad_u[i * Layout::stride + 3 * Layout::plane] = dims.skip_from_u ? g_skip[i] : A(0);
  }
  finish_u_output<T, K>(grad_u, n, a.grad_U + offset * K);
  if (a.grad_x != nullptr) {
    alignas(64) A grad_x_scratch[kBlock];
    A* __restrict__ grad_x = output_buffer(a.grad_x + offset, grad_x_scratch);
    for (int64_t i = 0; i < n; ++i) grad_x[i] = g_skip[i] * scale;
    finish_output(grad_x, n, a.grad_x + offset);
  }
  if (a.grad_weight_c != nullptr) {
    alignas(64) A pair_scratch[2 * kBlock];
    A* __restrict__ pairs = output_buffer(a.grad_weight_c + offset * 2, pair_scratch);
    for (int64_t i = 0; i < n; ++i) {
      pairs[2 * i] = g_wf[i];
      pairs[2 * i + 1] = g_wr[i];
    }
    finish_output(pairs, 2 * n, a.grad_weight_c + offset * 2);
  }
}

template <typename T, int K>
SRU_LEVEL_FN void backward_blocks(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& a,
                                  int64_t begin, int64_t end) {
  using A = accumulate_t<T>;
  const int64_t columns = dims.columns();
  const int64_t width = dims.directions * dims.hidden;
  const A scale = a.scale();
  BlockArena<A> arena(end - begin, kBackwardFields);
  for (int64_t task = begin; task < end; ++task) {
    const ColumnBlock blk = block_at(dims, task);
    const int64_t slot = task - begin;
    load(a.grad_c_last == nullptr ? nullptr : a.grad_c_last + blk.column, blk.n, arena.get(slot, kState), A(0));
    load_block_constants(dims, a, blk, arena, slot);
    for (int field = kForgetWeightSum; field < kBackwardFields; ++field) {
      load<T, A>(nullptr, kBlock, arena.get(slot, field), A(0));
    }
  }

  for (int64_t step = dims.length - 1; step >= 0; --step) {
    for (int64_t task = begin; task < end; ++task) {
      ColumnBlock next;
      int64_t next_step;
      if (block_ahead(dims, begin, end, task, step, -1, next, next_step)) {
        const int64_t next_offset = dims.time_of(next_step, next.d) * columns + next.column;
        prefetch(a.U + next_offset * K, next.n * K);
        prefetch(a.grad_h + next_offset, next.n);
        if (dims.skip_from_x) prefetch(a.x + next_offset, next.n);
        if (next_step > 0) prefetch(a.c_all + dims.time_of(next_step - 1, next.d) * columns + next.column, next.n);
      }
      const ColumnBlock blk = block_at(dims, task);
      const int64_t slot = task - begin;
      const int64_t t = dims.time_of(step, blk.d);
      const int64_t offset = t * columns + blk.column;
      if (a.grad_c_all != nullptr) {
        // The state after this step is an output too: its gradient joins the carried one.
        A* carried = arena.get(slot, kState);
        alignas(64) A incoming[kBlock];
        load(a.grad_c_all + offset, blk.n, incoming, A(0));
        for (int64_t i = 0; i < blk.n; ++i) carried[i] += incoming[i];
      }
      if (a.mask_pad != nullptr && a.mask_pad[t * dims.batch + blk.b]) {
        // Padding passed c through unchanged and emitted h = 0: only grad_c flows on.
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
      if (dims.restarts(a.reset, step, blk.d, blk.b)) {
        // The state entering a document's first step was c_starts (or zero), not the previous
        // document's: the carried gradient is c_starts', and none crosses the boundary (nor
        // reaches c0).
        if (a.grad_c_starts != nullptr) store(arena.get(slot, kState), blk.n, a.grad_c_starts + offset);
        load<T, A>(nullptr, blk.n, arena.get(slot, kState), A(0));
      }
    }
  }
  for (int64_t task = begin; task < end; ++task) {
    const ColumnBlock blk = block_at(dims, task);
    const int64_t slot = task - begin;
    store(arena.get(slot, kState), blk.n, a.grad_c0 + blk.column);
    A* bias_row = a.bias_partials + blk.b * 2 * width;
    std::copy_n(arena.get(slot, kForgetBiasSum), blk.n, bias_row + blk.weight);
    std::copy_n(arena.get(slot, kResetBiasSum), blk.n, bias_row + width + blk.weight);
    if (a.weight_c_partials != nullptr) {
      A* weight_row = a.weight_c_partials + blk.b * 2 * width;
      std::copy_n(arena.get(slot, kForgetWeightSum), blk.n, weight_row + blk.weight);
      std::copy_n(arena.get(slot, kResetWeightSum), blk.n, weight_row + width + blk.weight);
    }
  }
}

// The entry points of this level, one per pass (told apart by the argument type): a
// thread's range of blocks, run in chunks of kChunkBlocks.
template <typename T, int K>
SRU_LEVEL_TARGET void blocks_range(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& a,
                                   int64_t begin, int64_t end) {
  for (int64_t first = begin; first < end; first += kChunkBlocks) {
    forward_blocks<T, K>(dims, a, first, std::min(end, first + kChunkBlocks));
  }
}

template <typename T, int K>
SRU_LEVEL_TARGET void blocks_range(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& a,
                                   int64_t begin, int64_t end) {
  for (int64_t first = begin; first < end; first += kChunkBlocks) {
    backward_blocks<T, K>(dims, a, first, std::min(end, first + kChunkBlocks));
  }
}

// The entry points of storage type T at this level, for the level's table (sru_cpu_levels.h).
template <typename T>
StorageKernels<T> storage_kernels() {
  StorageKernels<T> kernels;
  kernels.forward[0] = &blocks_range<T, 3>;
  kernels.forward[1] = &blocks_range<T, 4>;
  kernels.backward[0] = &blocks_range<T, 3>;
  kernels.backward[1] = &blocks_range<T, 4>;
  return kernels;
}

#undef SRU_LEVEL_FN

}  // namespace level
}  // namespace

const LevelKernels& SRU_LEVEL_KERNELS() {
  static const LevelKernels kernels = [] {
    LevelKernels table;
#if SRU_LEVEL_ID != 3
    table.f32 = level::storage_kernels<float>();
    table.f64 = level::storage_kernels<double>();
    table.f16 = level::storage_kernels<c10::Half>();
#endif
    // Level 3 differs from level 2 only in narrowing bfloat16: the other storage types are
    // left to level 2 rather than compiled twice. A library for a processor that runs level
    // 3 (and no lower level: cpu_levels.py) leaves bfloat16 out of level 2, which no call reaches.
#if !(SRU_LEVEL_ID == 2 && defined(SRU_CPU_AVX512_WITHOUT_BF16))
    table.bf16 = level::storage_kernels<c10::BFloat16>();
#endif
    return table;
  }();
  return kernels;
}

}  // namespace sru_lightning
