/* bench.c: the I2_S matvec measurement for `mlconf bench` (not part of the runtime's ABI); the
 * twin of the native runtime's mlrt_bench_matvec (backends/native/src/bench.c), so the two are
 * comparable: same pool, same `threads` semantics, best of `iters` runs (CLOCK_MONOTONIC).
 *
 * One timed matvec is what a decode step does with one I2_S weight: the activation row's int8
 * quantization (quantize_act), every weight row's integer dot (dot_rows4 four rows at a time,
 * rows split across the pool's threads), and the float epilogue. The native benchmark times its
 * dots only (its activations are quantized beforehand), so this one is charged slightly more.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitnet.h"

ML_API double mlbitnet_bench_matvec(const char *isa, int rows, int cols, int threads, int iters, int evict_mib);

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
