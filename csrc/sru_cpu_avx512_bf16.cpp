// The CPU kernels for bfloat16 storage on processors with the AVX-512 BF16 instructions (the
// block loops: sru_cpu_blocks.h).
#include "sru_cpu_levels.h"
#ifdef SRU_X86_LEVELS
#define SRU_LEVEL_ID 3
#define SRU_LEVEL_TARGET SRU_TARGET_AVX512_BF16
#define SRU_LEVEL_KERNELS avx512_bf16_kernels
#include "sru_cpu_blocks.h"
#endif
