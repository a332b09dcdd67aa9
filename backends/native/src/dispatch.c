/* dispatch.c: which kernel table runs. The choice is the library's only global state: made once
 * from the CPU's features at the first ml_kernels() call, or forced by ml_set_isa() (meant to be
 * called before loading models; a later call affects only later kernel calls).
 *
 * The first choice is the table MLRT_ISA names, if runnable, else the best runnable one (cpu.h).
 * x86-64: "avx2" needs AVX2, FMA and F16C (the flags kern_avx2.c is compiled with) and the OS's
 * saving of the YMM registers (cpu.c: cpuid and xgetbv); "avxvnni" also AVX-VNNI; "avx512" AVX-512
 * F, BW, VL and VNNI with the OS saving the opmask and ZMM state (a CPU can advertise a feature the
 * OS leaves off, as AMX in some VMs). The 32-bit x86 build has no SIMD table. aarch64: "neon" is baseline; "neon-dotprod" needs HWCAP_ASIMDDP (Linux) or
 * hw.optional.arm.FEAT_DotProd (macOS).
 */
#include <string.h>

#include "../include/mlrt.h"
#include "cpu.h"
#include "kernels.h"
#include "util.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif


static int runnable(const ml_kernel_table *t) {
#if defined(__x86_64__)
    if (t == &ml_kernels_avx2) return ml_cpu_avx2();
    if (t == &ml_kernels_avxvnni) return ml_cpu_avxvnni();
    if (t == &ml_kernels_avx512) return ml_cpu_avx512vnni();
#endif
#if defined(__aarch64__)
    if (t == &ml_kernels_neon_dotprod) {
#if defined(__linux__)
        return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
        int v = 0;
        size_t len = sizeof v;
        return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0 && v != 0;
#else
        return 0;
#endif
    }
#endif
    (void)t;
    return 1;
}

/* Best first. */
static const ml_kernel_table *const tables[] = {
#if defined(__x86_64__) /* EVEX first: 256-bit vectors only (no AVX-512 frequency licence), and
                         * its 32 registers hold the packed GEMM's 4-token tiles (16: 2 tokens) */
    &ml_kernels_avx512,
    &ml_kernels_avxvnni,
    &ml_kernels_avx2,
#endif
#if defined(__aarch64__)
    &ml_kernels_neon_dotprod,
    &ml_kernels_neon,
#endif
    &ml_kernels_scalar,
};

static const ml_kernel_table *current; /* accessed with __atomic: ml_kernels() may race */

const ml_kernel_table *ml_kernels_named(const char *name) {
    if (name == NULL) return NULL;
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (strcmp(tables[i]->name, name) == 0) return runnable(tables[i]) ? tables[i] : NULL;
    return NULL;
}

const ml_kernel_table *ml_kernels(void) {
    const ml_kernel_table *t = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
    if (t != NULL) return t;
    t = ml_kernels_named(ml_isa_override()); /* MLRT_ISA, when it names a runnable table */
    for (size_t i = 0; t == NULL && i < sizeof tables / sizeof tables[0]; i++)
        if (runnable(tables[i])) {
            t = tables[i];
            break;
        }
    /* Two first callers compute the same answer; a concurrent ml_set_isa wins. */
    const ml_kernel_table *expected = NULL;
    if (!__atomic_compare_exchange_n(&current, &expected, t, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) t = expected;
    return t;
}

ML_API const char *ml_isa(void) { return ml_kernels()->name; }

ML_API int ml_set_isa(const char *isa) {
    if (isa == NULL) return ML_E_ARG;
    const ml_kernel_table *t = ml_kernels_named(isa);
    if (t == NULL) return ML_E_UNSUPPORTED;
    __atomic_store_n(&current, t, __ATOMIC_RELEASE);
    return ML_OK;
}
