// Storage <-> accumulation-type conversions of the CPU block loops at one vector level:
// widening on load, narrowing on store, and the layout of U in the step loops (ULayout).
// Included by sru_cpu_blocks.h only, inside its namespace, with the same level macros
// (SRU_LEVEL_ID, SRU_LEVEL_FN); no include guard, no includes.

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
