/* dispatch.c: which I2_S kernel table runs, and the library-level functions of the ABI.
 *
 * The choice is the library's only global state: made once from the CPU's features at the first
 * i2s_kernels() call (the table MLRT_ISA names if runnable, else the best runnable one), or forced
 * by ml_set_isa() (before loading models). x86-64: "avx2" needs AVX2, FMA and F16C and the OS's
 * saving of the YMM registers (native/src/cpu.c: cpuid and xgetbv); "avxvnni" AVX-VNNI on top;
 * "avx512" AVX-512 F, BW and VNNI with the ZMM state saved. aarch64: "neon" is baseline.
 */
#include <string.h>

#include "bitnet.h"
#include "../../native/src/cpu.h"

static int runnable(const i2s_kernel_table *t) {
#if defined(__x86_64__)
    if (t == &i2s_kernels_avx512) return ml_cpu_avx512vnni();
    if (t == &i2s_kernels_avxvnni) return ml_cpu_avxvnni();
    if (t == &i2s_kernels_avx2) return ml_cpu_avx2();
#endif
    (void)t;
    return 1;
}

/* Best first. */
static const i2s_kernel_table *const tables[] = {
#if defined(__x86_64__)
    &i2s_kernels_avx512,
    &i2s_kernels_avxvnni,
    &i2s_kernels_avx2,
#endif
#if defined(__aarch64__)
    &i2s_kernels_neon,
#endif
    &i2s_kernels_scalar,
};

static const i2s_kernel_table *current; /* accessed with __atomic: i2s_kernels() may race */

const i2s_kernel_table *i2s_kernels_named(const char *name) {
    if (name == NULL) return NULL;
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (strcmp(tables[i]->name, name) == 0) return runnable(tables[i]) ? tables[i] : NULL;
    return NULL;
}

const i2s_kernel_table *i2s_kernels(void) {
    const i2s_kernel_table *t = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
    if (t != NULL) return t;
    t = i2s_kernels_named(ml_isa_override()); /* MLRT_ISA, when it names a runnable table */
    for (size_t i = 0; t == NULL && i < sizeof tables / sizeof tables[0]; i++)
        if (runnable(tables[i])) {
            t = tables[i];
            break;
        }
    const i2s_kernel_table *expected = NULL;
    if (!__atomic_compare_exchange_n(&current, &expected, t, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) t = expected;
    return t;
}

ML_API const char *ml_version(void) { return "mlbitnet 0.1.0"; }

ML_API const char *ml_isa(void) { return i2s_kernels()->name; }

ML_API int ml_set_isa(const char *isa) {
    if (isa == NULL) return ML_E_ARG;
    const i2s_kernel_table *t = i2s_kernels_named(isa);
    if (t == NULL) return ML_E_UNSUPPORTED;
    __atomic_store_n(&current, t, __ATOMIC_RELEASE);
    return ML_OK;
}
