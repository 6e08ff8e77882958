// The CPU kernels for processors with AVX-512 (F, VL and BW) (the block loops: sru_cpu_blocks.h).
#include "sru_cpu_levels.h"
#ifdef SRU_X86_LEVELS
#define SRU_LEVEL_ID 2
#define SRU_LEVEL_TARGET SRU_TARGET_AVX512
#define SRU_LEVEL_KERNELS avx512_kernels
#include "sru_cpu_blocks.h"
#endif
