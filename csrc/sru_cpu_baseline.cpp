// The CPU kernels for any processor, at the compiler's default target (the block loops: sru_cpu_blocks.h).
#include "sru_cpu_levels.h"

#define SRU_LEVEL_ID 0
#define SRU_LEVEL_TARGET
#define SRU_LEVEL_KERNELS baseline_kernels
#include "sru_cpu_blocks.h"

