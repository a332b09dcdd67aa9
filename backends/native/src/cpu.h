/* cpu.h: what the CPU and the OS let the kernels use, and the MLRT_ISA override of the first
 * choice. Shared by libmlrt and libmlbitnet (each keeps its own table list in dispatch.c). */
#ifndef ML_CPU_H
#define ML_CPU_H

/* 1 when the CPU has AVX2, FMA and F16C and the OS saves the XMM and YMM registers (the flags
 * kern_avx2.c and i2s_avx2.c are compiled with); 0 elsewhere, and on every non-x86 target. */
int ml_cpu_avx2(void);

/* 1 when ml_cpu_avx2() and the CPU has AVX-VNNI (VEX vpdpbusd, cpuid leaf 7.1 EAX bit 4). */
int ml_cpu_avxvnni(void);

/* 1 when ml_cpu_avx2() and the CPU has AVX-512 F, BW, VL and VNNI and the OS saves the opmask and
 * ZMM registers (XCR0 bits 5, 6, 7). A CPU can advertise a feature the OS leaves disabled. */
int ml_cpu_avx512vnni(void);

/* The MLRT_ISA environment variable (e.g. "scalar"), or NULL when unset or empty: the table a
 * library starts on instead of the best one, if it has a runnable table of that name. It lets one
 * machine run as one with fewer features (a host without AVX2); ml_isa() says what runs. */
const char *ml_isa_override(void);

#endif
