/* kern_avx2.c: the AVX2 table (compiled with -mavx2 -mfma -mf16c; runnable when the CPU has AVX2,
 * FMA and F16C and the OS saves the YMM registers). The kernels are kern_x86.h's. */
#include "kern_x86.h"

const ml_kernel_table ml_kernels_avx2 = X86_TABLE("avx2");
