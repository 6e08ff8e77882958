// sru_cuda_kernels.cu compiled as C++ (with -DSRU_CUDA_EMULATION) for the CPU emulation of
// the CUDA kernels: the build tools pick the compiler by file extension, so this wrapper
// hands the unchanged CUDA source to the C++ compiler.
#include "sru_cuda_kernels.cu"
