// The CPU kernels for processors with AVX2, FMA and F16C (the block loops: sru_cpu_blocks.h).
#include "sru_cpu_levels.h"
#ifdef SRU_X86_LEVELS
#define SRU_LEVEL_ID 1
#define SRU_LEVEL_TARGET SRU_TARGET_AVX2
#define SRU_LEVEL_KERNELS avx2_kernels
#include "sru_cpu_blocks.h"
#endif
