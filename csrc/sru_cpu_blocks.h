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
// values into small float arrays, runs the float loops of the float32 kernels over them
// (with the gate exponential matched to the storage's precision, see sru_step.h), and
// narrows h, c, the gradients on store. Float and double storage skip the copies.
//
// No include guard and no includes: the level file includes sru_cpu_levels.h first.

namespace sru_lightning {
namespace {
namespace level {
using namespace cpu_blocks;

#define SRU_LEVEL_FN SRU_ALWAYS_INLINE SRU_LEVEL_TARGET

template <typename T>
constexpr bool is_half_storage = !std::is_same_v<T, accumulate_t<T>>;

// The exponential of the gates, as accurate as the storage keeps (sru_step.h).
template <typename T>
constexpr ExpAccuracy exp_accuracy = is_half_storage<T> ? ExpAccuracy::half_storage : ExpAccuracy::float_storage;

// Storage values to the accumulation type. Conversions round like c10's (round to nearest
// even); the vector instructions used where present give the same bits, except that the
// AVX-512 BF16 narrowing (level 3) flushes float denormals (|v| < 1.2e-38) to zero.
template <typename T>
SRU_LEVEL_FN void widen(const T* __restrict__ source, int64_t n, accumulate_t<T>* __restrict__ target) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    // A bfloat16 is the top half of a float: zero-extend its bits and shift them up.
    const uint16_t* __restrict__ bits = reinterpret_cast<const uint16_t*>(source);
#if SRU_LEVEL_ID >= 2
    for (; i + 16 <= n; i += 16) {
      const __m512i words = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i)));
      _mm512_storeu_si512(target + i, _mm512_slli_epi32(words, 16));
    }
#elif SRU_LEVEL_ID == 1
    for (; i + 8 <= n; i += 8) {
      const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + i)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(target + i), _mm256_slli_epi32(words, 16));
    }
#endif
    for (; i < n; ++i) {
      const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(target + i, &word, sizeof(float));
    }
  } else if constexpr (std::is_same_v<T, c10::Half>) {
#if SRU_LEVEL_ID >= 2
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(target + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(source + i))));
    }
#elif SRU_LEVEL_ID == 1
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(target + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i))));
    }
#endif
    for (; i < n; ++i) target[i] = static_cast<float>(source[i]);
  } else {
    for (; i < n; ++i) target[i] = static_cast<accumulate_t<T>>(source[i]);
  }
}

// The bfloat16 bits of a float: rounded to nearest even on the bits, a NaN to the quiet NaN
// c10 uses (the vector code below does the same on 16 or 32 values at once).
SRU_LEVEL_FN uint16_t bfloat16_bits(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(float));
  const uint32_t rounded = (word + 0x7FFFu + ((word >> 16) & 1u)) >> 16;
  return value != value ? uint16_t(0x7FC0) : static_cast<uint16_t>(rounded);
}

#if SRU_LEVEL_ID >= 2
#if SRU_LEVEL_ID == 2
// Each float lane with its bfloat16 rounding in the upper word (the lower word is left over).
SRU_LEVEL_FN __m512i rounded_in_upper_words(__m512 values) {
  const __m512i word = _mm512_castps_si512(values);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(word, 16), _mm512_set1_epi32(1));
  // The sum is written to the lanes holding a number; the others keep the quiet NaN.
  const __mmask16 number = _mm512_cmp_ps_mask(values, values, _CMP_ORD_Q);
  return _mm512_mask_add_epi32(_mm512_set1_epi32(0x7FC00000), number, word,
                               _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
}

// Word w of the result: the upper word of lane w of the first source (w < 16), or of lane
// w - 16 of the second.
struct UpperWordIndices {
  alignas(64) uint16_t words[32];
  constexpr UpperWordIndices() : words{} {
    for (int w = 0; w < 32; ++w) words[w] = static_cast<uint16_t>(w < 16 ? 2 * w + 1 : 32 + 2 * (w - 16) + 1);
  }
};
inline constexpr UpperWordIndices kUpperWordIndices{};
#endif

// Two vectors of 16 floats as 32 bfloat16 words, the first vector's in words 0..15.
SRU_LEVEL_FN __m512i bfloat16_pair(__m512 first, __m512 second) {
#if SRU_LEVEL_ID == 3
  const __m512bh pair = _mm512_cvtne2ps_pbh(second, first);
  return reinterpret_cast<const __m512i&>(pair);
#else
  return _mm512_permutex2var_epi16(rounded_in_upper_words(first), _mm512_load_si512(kUpperWordIndices.words),
                                   rounded_in_upper_words(second));
#endif
}
#endif

template <typename T>
SRU_LEVEL_FN void narrow(const accumulate_t<T>* __restrict__ source, int64_t n, T* __restrict__ target) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    uint16_t* __restrict__ bits = reinterpret_cast<uint16_t*>(target);
#if SRU_LEVEL_ID >= 2
    for (; i + 32 <= n; i += 32) {
      _mm512_storeu_si512(bits + i, bfloat16_pair(_mm512_loadu_ps(source + i), _mm512_loadu_ps(source + i + 16)));
    }
    if (i + 16 <= n) {
      const __m512i pair = bfloat16_pair(_mm512_loadu_ps(source + i), _mm512_setzero_ps());
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i), _mm512_castsi512_si256(pair));
      i += 16;
    }
#elif SRU_LEVEL_ID == 1
    const __m256i half_ulp = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    const __m256i quiet_nan = _mm256_set1_epi32(0x7FC0);
    for (; i + 16 <= n; i += 16) {
      __m256i halves[2];
      for (int part = 0; part < 2; ++part) {
        const __m256 values = _mm256_loadu_ps(source + i + 8 * part);
        const __m256i word = _mm256_castps_si256(values);
        const __m256i bias = _mm256_add_epi32(half_ulp, _mm256_and_si256(_mm256_srli_epi32(word, 16), one));
        const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(word, bias), 16);
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(values, values, _CMP_UNORD_Q));
        halves[part] = _mm256_blendv_epi8(rounded, quiet_nan, nan);
      }
      // packus interleaves the 128-bit lanes of its two sources; the permute restores order.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves[0], halves[1]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i), packed);
    }
#endif
    for (; i < n; ++i) bits[i] = bfloat16_bits(source[i]);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
#if SRU_LEVEL_ID >= 1
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif
#if SRU_LEVEL_ID >= 2
    for (; i + 16 <= n; i += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(target + i), _mm512_cvtps_ph(_mm512_loadu_ps(source + i), kRound));
    }
#elif SRU_LEVEL_ID == 1
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(target + i), _mm256_cvtps_ph(_mm256_loadu_ps(source + i), kRound));
    }
#endif
    for (; i < n; ++i) target[i] = static_cast<c10::Half>(source[i]);
  } else {
    for (; i < n; ++i) target[i] = static_cast<T>(source[i]);
  }
}

// Where a block's U lies for the step loops, in the accumulation type: value j of column i is
// u[i * stride + j * plane]. Float and double storage are read where they lie (k values per
// column, interleaved), and so is float16, widened in place order. bfloat16 at the AVX-512
// levels is widened into planes of kBlock values (all U0 of the block, then all U1, ...): a
// bfloat16 is the top half of a float, so one word permutation per plane and 16 columns both
// gathers U_j and widens it (widen_planes), where the interleaved layout needs a widening and
// then two float permutations per plane in the loop.
template <typename T, int K>
struct ULayout {
#if SRU_LEVEL_ID >= 2
  static constexpr bool planar = std::is_same_v<T, c10::BFloat16>;
#else
  static constexpr bool planar = false;
#endif
  static constexpr int64_t stride = planar ? 1 : K;
  static constexpr int64_t plane = planar ? kBlock : 1;
};

#if SRU_LEVEL_ID >= 2
// The word permutations of widen_planes: for plane j, word 2i + 1 of the result (the upper
// half of float lane i) takes U_j of column i, word K * i + j of the group's 16 columns.
template <int K>
struct PlaneIndices {
  alignas(64) uint16_t words[K][32];
  constexpr PlaneIndices() : words{} {
    for (int j = 0; j < K; ++j) {
      for (int i = 0; i < 16; ++i) words[j][2 * i + 1] = static_cast<uint16_t>(K * i + j);
    }
  }
};
template <int K>
inline constexpr PlaneIndices<K> kPlaneIndices{};

// bfloat16 values of n columns, K per column, into K planes of kBlock floats.
template <int K>
SRU_LEVEL_FN void widen_planes(const uint16_t* __restrict__ bits, int64_t n, float* __restrict__ planes) {
  static_assert(K == 3 || K == 4, "16 columns of U fill at most two 512-bit registers");
  constexpr __mmask32 kUpperWords = 0xAAAAAAAAu;  // the lower word of every lane stays zero
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint16_t* group = bits + i * K;
    const __m512i first = _mm512_loadu_si512(group);  // words 0..31
    const __m512i second = K == 4 ? _mm512_loadu_si512(group + 32)
                                  : _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32)));
    for (int j = 0; j < K; ++j) {
      const __m512i index = _mm512_load_si512(kPlaneIndices<K>.words[j]);
      _mm512_storeu_si512(planes + j * kBlock + i, _mm512_maskz_permutex2var_epi16(kUpperWords, first, index, second));
    }
  }
  for (; i < n; ++i) {
    for (int j = 0; j < K; ++j) {
      const uint32_t word = static_cast<uint32_t>(bits[i * K + j]) << 16;
      std::memcpy(planes + j * kBlock + i, &word, sizeof(float));
    }
  }
}
#endif

// The block's U (n columns) in the accumulation type, laid out as ULayout<T, K> says: the
// storage itself for float and double, else widened into `scratch` (K * kBlock values).
template <typename T, int K>
SRU_LEVEL_FN const accumulate_t<T>* widened_u(const T* source, int64_t n, accumulate_t<T>* scratch) {
  if constexpr (ULayout<T, K>::planar) {
#if SRU_LEVEL_ID >= 2
    widen_planes<K>(reinterpret_cast<const uint16_t*>(source), n, scratch);
#endif
    return scratch;
  } else if constexpr (is_half_storage<T>) {
    widen(source, n * K, scratch);
    return scratch;
  } else {
    return source;
  }
}

// Values read in the accumulation type: the storage itself for float and double, else the
// storage widened into `scratch`.
template <typename T>
SRU_LEVEL_FN const accumulate_t<T>* widened(const T* source, int64_t n, accumulate_t<T>* scratch) {
  if constexpr (is_half_storage<T>) {
    widen(source, n, scratch);
    return scratch;
  } else {
    return source;
  }
}

// Where a loop writes an output: the output itself for float and double, else `scratch`,
// which finish_output then narrows into the output.
template <typename T>
SRU_LEVEL_FN accumulate_t<T>* output_buffer(T* target, accumulate_t<T>* scratch) {
  if constexpr (is_half_storage<T>) {
    return scratch;
  } else {
    return target;
  }
}

template <typename T>
SRU_LEVEL_FN void finish_output(const accumulate_t<T>* buffer, int64_t n, T* target) {
  if constexpr (is_half_storage<T>) narrow(buffer, n, target);
}

#if SRU_LEVEL_ID >= 2
// The word permutations of narrow_planes: word w of the output (U_j of column c, w = K * c + j)
// from the pair of planes 0 and 1 (words 16 * j + c) or of planes 2 and 3 (32 + 16 * (j - 2) + c).
template <int K>
struct InterleaveIndices {
  alignas(64) uint16_t words[2][32];
  constexpr InterleaveIndices() : words{} {
    for (int w = 0; w < 64; ++w) {
      const int c = w / K, j = w % K;
      if (c < 16) words[w / 32][w % 32] = static_cast<uint16_t>(j < 2 ? 16 * j + c : 32 + 16 * (j - 2) + c);
    }
  }
};
template <int K>
inline constexpr InterleaveIndices<K> kInterleaveIndices{};

// K planes of kBlock floats (n columns) into bfloat16 values, K per column: the inverse of
// widen_planes, two planes narrowed into one register and the pairs interleaved by word.
template <int K>
SRU_LEVEL_FN void narrow_planes(const float* __restrict__ planes, int64_t n, uint16_t* __restrict__ bits) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i low = bfloat16_pair(_mm512_loadu_ps(planes + i), _mm512_loadu_ps(planes + kBlock + i));
    const __m512i high = bfloat16_pair(_mm512_loadu_ps(planes + 2 * kBlock + i),
                                       K == 4 ? _mm512_loadu_ps(planes + 3 * kBlock + i) : _mm512_setzero_ps());
    uint16_t* group = bits + i * K;
    _mm512_storeu_si512(group, _mm512_permutex2var_epi16(low, _mm512_load_si512(kInterleaveIndices<K>.words[0]), high));
    const __m512i rest = _mm512_permutex2var_epi16(low, _mm512_load_si512(kInterleaveIndices<K>.words[1]), high);
    if constexpr (K == 4) {
      _mm512_storeu_si512(group + 32, rest);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(group + 32), _mm512_castsi512_si256(rest));
    }
  }
  for (; i < n; ++i) {
    for (int j = 0; j < K; ++j) bits[i * K + j] = bfloat16_bits(planes[j * kBlock + i]);
  }
}
#endif

// The block's U-shaped output (n columns, laid out as ULayout<T, K> says) into the storage.
template <typename T, int K>
SRU_LEVEL_FN void finish_u_output(const accumulate_t<T>* buffer, int64_t n, T* target) {
  if constexpr (ULayout<T, K>::planar) {
#if SRU_LEVEL_ID >= 2
    narrow_planes<K>(buffer, n, reinterpret_cast<uint16_t*>(target));
#endif
  } else {
    finish_output(buffer, n * K, target);
  }
}

template <typename T, typename A>
SRU_LEVEL_FN void load(const T* __restrict__ source, int64_t n, A* __restrict__ target, A fallback) {
  if (source == nullptr) {
    for (int64_t i = 0; i < n; ++i) target[i] = fallback;
  } else {
    widen(source, n, target);
  }
}

template <typename T, typename A>
SRU_LEVEL_FN void store(const A* __restrict__ source, int64_t n, T* __restrict__ target) {
  narrow(source, n, target);
}

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
