/* kern_avxvnni.c: the AVX-VNNI table (compiled with -mavx2 -mfma -mf16c -mavxvnni; runnable when
 * the CPU also has AVX-VNNI, cpuid leaf 7.1 EAX bit 4). The kernels are kern_x86.h's, with the
 * VEX vpdpbusd for the integer block sums. */
#include "kern_x86.h"

#ifndef DPBUSD
#error "kern_avxvnni.c needs -mavxvnni"
#endif

const ml_kernel_table ml_kernels_avxvnni = X86_TABLE("avxvnni");
