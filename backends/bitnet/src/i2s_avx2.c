/* i2s_avx2.c: PLACEHOLDER until the AVX2 kernels land (delegates to the scalar twin). */
#include "i2s_kernels.h"
const i2s_kernel_table i2s_kernels_avx2 = {"avx2", 0, 0, 0};
