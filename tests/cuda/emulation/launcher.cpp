// The real launcher (validation, workspace, dispatch) compiled as host C++
// against the emulated runtime in cuda_runtime.h beside this file.
#include "kernels/cuda/fp32_backward.cu"
