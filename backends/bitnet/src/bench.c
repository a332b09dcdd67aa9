/* bench.c: the I2_S matvec measurement for `mlconf bench` (not part of the runtime's ABI); the
 * twin of the native runtime's mlrt_bench_matvec (backends/native/src/bench.c), so the two are
 * comparable: same pool, same `threads` semantics, best of `iters` runs (CLOCK_MONOTONIC).
 *
 * One timed matvec is what a decode step does with one I2_S weight: the activation row's int8
 * quantization (quantize_act), every weight row's integer dot (dot_rows4 four rows at a time,
 * rows split across the pool's threads), and the float epilogue. The native benchmark times its
 * dots only (its activations are quantized beforehand), so this one is charged slightly more.
 *
 * Also the machine's int8 and f32 multiply-add peaks (mlbitnet_bench_int8_peak, _f32_peak, at the
 * end), which `mlconf bench bitnet` sets a prefill's multiply-adds against.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitnet.h"
#include "../../native/src/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

ML_API double mlbitnet_bench_matvec(const char *isa, int rows, int cols, int threads, int iters, int evict_mib);
ML_API double mlbitnet_bench_int8_peak(const char *isa, int threads, int iters);
ML_API double mlbitnet_bench_f32_peak(const char *isa, int threads, int iters);

/* Cold runs (evict_mib > 0): before each timed product the pool's threads read evict_mib MiB (the
 * caller sizes it from the machine's last-level cache: a 260 MiB L3 keeps a 128 MiB buffer's worth
 * of weights) so the weights come from memory, as in a forward pass where every matrix is used once
 * per token. Reads, not memset: a large memset uses non-temporal stores, which bypass the caches
 * and evict nothing. */

static void evict_chunk(void *arg, int64_t i0, int64_t i1) {
    const uint64_t *p = (const uint64_t *)arg + (size_t)i0 * 512, *e = (const uint64_t *)arg + (size_t)i1 * 512;
    uint64_t acc = 0;
    for (; p < e; p += 8) acc += p[0]; /* one load per 64-byte line */
    ((volatile uint64_t *)arg)[(size_t)i0 * 512] = acc; /* keeps the loads; the chunk is this thread's */
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint32_t next(uint32_t *s) { /* xorshift32: bench data only */
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

typedef struct {
    const i2s_kernel_table *k;
    int cols;
    const uint8_t *w; /* rows of cols / 4 bytes */
    const int8_t *xq;
    int32_t asum;
    float a, d;
    float *y;
} matvec_job;

static void matvec_rows(void *arg, int64_t r0, int64_t r1) {
    const matvec_job *j = arg;
    const size_t rb = (size_t)j->cols / 4;
    int32_t s[4];
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        j->k->dot_rows4(j->cols, j->w + (size_t)r * rb, j->xq, s);
        for (int u = 0; u < 4; u++) j->y[r + u] = i2s_epilogue(s[u], j->asum, j->a, j->d);
    }
    for (; r < r1; r++) j->y[r] = i2s_epilogue(j->k->dot(j->cols, j->w + (size_t)r * rb, j->xq), j->asum, j->a, j->d);
}

/* Seconds per I2_S matrix-vector product (rows x cols, cols a positive multiple of 128), best of
 * iters after one warm-up run, cold (weights from memory) or not; negative for an ISA that cannot
 * run here, a bad shape or a failed allocation. Weight bytes streamed per product: rows * cols / 4. */
ML_API double mlbitnet_bench_matvec(const char *isa, int rows, int cols, int threads, int iters,
                                    int evict_mib) {
    const i2s_kernel_table *k = i2s_kernels_named(isa);
    if (!k || rows <= 0 || cols <= 0 || cols % I2S_BLOCK || iters <= 0) return -1.0;
    size_t wbytes = (size_t)rows * (size_t)cols / 4;
    uint8_t *w = malloc(wbytes);
    float *x = malloc((size_t)cols * sizeof(float));
    int8_t *xq = malloc((size_t)cols);
    float *y = malloc((size_t)rows * sizeof(float));
    struct ml_pool *pool = ml_pool_new(threads);
    size_t evict = (size_t)(evict_mib > 0 ? evict_mib : 0) << 20;
    uint8_t *junk = evict ? malloc(evict) : NULL;
    if (junk) memset(junk, 1, evict); /* real pages: an untouched buffer reads one zero page */
    double best = -1.0;
    if (w && x && xq && y && pool && (junk || !evict)) {
        uint32_t s = 12345u;
        for (size_t i = 0; i < wbytes; i++) { /* codes 0..2: ternary weights */
            unsigned v = next(&s);
            w[i] = (uint8_t)((v % 3) << 6 | (v / 3 % 3) << 4 | (v / 9 % 3) << 2 | (v / 27 % 3));
        }
        for (int i = 0; i < cols; i++) x[i] = (float)((int)(next(&s) % 2001u) - 1000) * 1e-3f;
        matvec_job job = {k, cols, w, xq, 0, 0.0f, 0.02f, y};
        best = 1e30;
        for (int it = -1; it < iters; it++) { /* it = -1: warm-up */
            if (evict) ml_pool_run(pool, (int64_t)(evict / 4096), evict_chunk, junk);
            double t0 = now();
            job.a = k->quantize_act(x, cols, xq, &job.asum);
            ml_pool_run(pool, rows, matvec_rows, &job);
            double dt = now() - t0;
            if (it >= 0 && dt < best) best = dt;
        }
    }
    if (pool) ml_pool_free(pool);
    free(junk);
    free(w);
    free(x);
    free(xq);
    free(y);
    return best;
}

/* ---------------------------------------------------------------- arithmetic peaks
 * The machine's multiply-accumulate peaks, for setting a prefill's MACs against them: each thread
 * of the pool runs `iters` rounds of PEAK_CHAINS independent accumulations (enough to cover the
 * latency of an FMA or a vpdpbusd: 4-5 cycles on two ports) on values that stay in registers, and
 * the result is multiply-adds per second over all threads, best of PEAK_REPS after a warm-up run
 * (which also lets the clock settle after AVX-512 starts). Each ISA's loop is a function compiled
 * for that ISA alone (the target attribute), called only when the CPU and the OS run it.
 *   int8  avx2     vpmaddubsw (32 u8 x s8 products, summed in pairs) + vpaddw, 256-bit
 *         avxvnni  VEX vpdpbusd (32 products into 8 int32 sums), 256-bit
 *         avx512   EVEX vpdpbusd, 512-bit (64 products)
 *   f32   avx2     vfmadd231ps, 8 lanes
 *         avx512   vfmadd231ps, 16 lanes
 * The empty asm statements tell the compiler the operands changed (they emit no instruction), so
 * it can neither hoist nor merge the products. Other ISAs (and non-x86 builds) return -1. */
#define PEAK_CHAINS 12
#define PEAK_REPS 3

#if defined(__x86_64__)
#define PEAK_OPAQUE(v) __asm__("" : "+x"(v));
#define PEAK_SINK(v) __asm__ volatile("" : : "x"(v));
#define PEAK_EACH(M) M(c0) M(c1) M(c2) M(c3) M(c4) M(c5) M(c6) M(c7) M(c8) M(c9) M(c10) M(c11)
/* twelve accumulators the compiler cannot prove equal (it would merge equal chains into one) */
#define PEAK_DECL(T, zero)                                                                          \
    T c0 = zero, c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0, c9 = c0, \
      c10 = c0, c11 = c0;                                                                           \
    PEAK_EACH(PEAK_OPAQUE)

__attribute__((target("avx2"))) static void peak_int8_avx2(int64_t iters) {
    __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(-1);
    PEAK_DECL(__m256i, _mm256_setzero_si256())
#define MADD(c) PEAK_OPAQUE(a) c = _mm256_add_epi16(c, _mm256_maddubs_epi16(a, b));
    for (int64_t i = 0; i < iters; i++) { PEAK_EACH(MADD) }
#undef MADD
    PEAK_EACH(PEAK_SINK)
}

__attribute__((target("avx2,avxvnni"))) static void peak_int8_avxvnni(int64_t iters) {
    __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(-1);
    PEAK_DECL(__m256i, _mm256_setzero_si256())
#define DP(c) c = _mm256_dpbusd_avx_epi32(c, a, b);
    for (int64_t i = 0; i < iters; i++) {
        PEAK_OPAQUE(a) PEAK_OPAQUE(b) PEAK_EACH(DP)
    }
#undef DP
    PEAK_EACH(PEAK_SINK)
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void peak_int8_avx512(int64_t iters) {
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
    PEAK_DECL(__m512i, _mm512_setzero_si512())
#define DP(c) c = _mm512_dpbusd_epi32(c, a, b);
    for (int64_t i = 0; i < iters; i++) {
        PEAK_OPAQUE(a) PEAK_OPAQUE(b) PEAK_EACH(DP)
    }
#undef DP
    PEAK_EACH(PEAK_SINK)
}

__attribute__((target("avx2,fma"))) static void peak_f32_avx2(int64_t iters) {
    __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(0.0f);
    PEAK_DECL(__m256, _mm256_setzero_ps())
#define FMA(c) c = _mm256_fmadd_ps(a, b, c);
    for (int64_t i = 0; i < iters; i++) {
        PEAK_OPAQUE(a) PEAK_OPAQUE(b) PEAK_EACH(FMA)
    }
#undef FMA
    PEAK_EACH(PEAK_SINK)
}

__attribute__((target("avx512f"))) static void peak_f32_avx512(int64_t iters) {
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.0f);
    PEAK_DECL(__m512, _mm512_setzero_ps())
#define FMA(c) c = _mm512_fmadd_ps(a, b, c);
    for (int64_t i = 0; i < iters; i++) {
        PEAK_OPAQUE(a) PEAK_OPAQUE(b) PEAK_EACH(FMA)
    }
#undef FMA
    PEAK_EACH(PEAK_SINK)
}

typedef struct {
    void (*loop)(int64_t iters);
    int64_t iters;
} peak_job;

static void peak_chunk(void *arg, int64_t i0, int64_t i1) { /* one unit per thread (n = threads) */
    const peak_job *j = arg;
    for (int64_t i = i0; i < i1; i++) j->loop(j->iters);
}

/* Multiply-adds per second of `loop` on `threads` threads (each `iters` rounds of PEAK_CHAINS
 * instructions of `macs` multiply-adds); -1 on bad arguments or a failed pool. */
static double peak_run(void (*loop)(int64_t), int macs, int threads, int iters) {
    if (!loop || threads <= 0 || iters <= 0) return -1.0;
    struct ml_pool *pool = ml_pool_new(threads);
    if (!pool) return -1.0;
    peak_job job = {loop, iters};
    double best = 1e30;
    for (int rep = -1; rep < PEAK_REPS; rep++) { /* rep = -1: warm-up */
        double t0 = now();
        ml_pool_run(pool, threads, peak_chunk, &job);
        double dt = now() - t0;
        if (rep >= 0 && dt < best) best = dt;
    }
    ml_pool_free(pool);
    return (double)threads * (double)iters * PEAK_CHAINS * macs / best;
}
#endif

/* int8 multiply-accumulates per second (u8 x s8 products) of the `isa` loop above on `threads`
 * threads; -1 for an ISA without one, one the CPU cannot run here, or bad arguments. */
ML_API double mlbitnet_bench_int8_peak(const char *isa, int threads, int iters) {
    if (!isa) return -1.0;
#if defined(__x86_64__)
    if (strcmp(isa, "avx2") == 0 && ml_cpu_avx2()) return peak_run(peak_int8_avx2, 32, threads, iters);
    if (strcmp(isa, "avxvnni") == 0 && ml_cpu_avxvnni()) return peak_run(peak_int8_avxvnni, 32, threads, iters);
    if (strcmp(isa, "avx512") == 0 && ml_cpu_avx512vnni()) return peak_run(peak_int8_avx512, 64, threads, iters);
#endif
    (void)threads, (void)iters;
    return -1.0;
}

/* float32 multiply-adds per second (FMA lanes) of the `isa` loop above on `threads` threads; -1
 * for an ISA without one ("avxvnni" has no float instructions of its own), one the CPU cannot
 * run here, or bad arguments. */
ML_API double mlbitnet_bench_f32_peak(const char *isa, int threads, int iters) {
    if (!isa) return -1.0;
#if defined(__x86_64__)
    if (strcmp(isa, "avx2") == 0 && ml_cpu_avx2()) return peak_run(peak_f32_avx2, 8, threads, iters);
    if (strcmp(isa, "avx512") == 0 && ml_cpu_avx512vnni()) return peak_run(peak_f32_avx512, 16, threads, iters);
#endif
    (void)threads, (void)iters;
    return -1.0;
}
