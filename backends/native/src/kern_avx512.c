/* kern_avx512.c: the AVX-512 table (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni
 * beside the AVX2 flags; runnable when the CPU has AVX-512 F, BW, VL and VNNI and the OS saves the
 * opmask and ZMM state). The kernels are kern_x86.h's, with the EVEX vpdpbusd on 256-bit vectors:
 * the table for AVX-512 VNNI CPUs without AVX-VNNI (Cascade Lake, Ice Lake, Zen 4). */
#include "kern_x86.h"

#ifndef DPBUSD
#error "kern_avx512.c needs -mavx512vnni -mavx512vl"
#endif

const ml_kernel_table ml_kernels_avx512 = X86_TABLE("avx512");
