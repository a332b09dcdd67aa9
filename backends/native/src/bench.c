/* bench.c: measurement entry points for `mlconf bench` (not part of the runtime's ABI).
 *
 * mlrt_bench_read_bw   read bandwidth of a buffer over threads: the memory's (far above the
 *                      last-level cache) or the cache's (well below it)
 * mlrt_bench_matvec    matrix-vector products of one ISA and weight type, rows over threads,
 *                      weights in cache or (cold) from memory, by forward.c's decode path
 * mlrt_bench_kernel    in-cache cost of one kernel on 4096 values (ns per call)
 * Timings are the best of `iters` runs (CLOCK_MONOTONIC); results only, no printing.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "model.h"
#include "util.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A cheap deterministic generator for bench data (values only matter for not being zero). */
static uint32_t next(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* 8 independent 64-bit sums over 4 KiB pages [i0, i1) of the buffer (the compiler vectorizes
 * it), so the loop is bound by the memory or cache, not by a dependency chain; the sum goes to the
 * chunk's own first word, which keeps the loads and no other thread touches. The lines 2 KiB ahead
 * are prefetched, as the GEMM's decode does (kern_x86.h PF): without it this read 5-10 % less
 * (AMD EPYC), and the bandwidth decode is set against must be the best the machine gives. */
static void read_pages(void *arg, int64_t i0, int64_t i1) {
    uint64_t *buf = arg;
    const uint64_t *p = buf + (size_t)i0 * 512, *e = buf + (size_t)i1 * 512;
    uint64_t acc[8] = {0};
    for (; p < e; p += 8) {
        __builtin_prefetch(p + 256);
        for (int k = 0; k < 8; k++) acc[k] += p[k];
    }
    uint64_t sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    ((volatile uint64_t *)buf)[(size_t)i0 * 512] = sum;
}

/* Read bandwidth in GB/s (best of iters) of `threads` threads summing `bytes` (a multiple of
 * 4 KiB): far above the last-level cache it is the memory's, well below it the cache's. */
ML_API double mlrt_bench_read_bw(size_t bytes, int iters, int threads) {
    size_t pages = bytes / 4096;
    uint64_t *buf = pages ? ml_alloc_large(pages * 4096) : NULL;
    struct ml_pool *pool = ml_pool_new(threads);
    double best = -1.0;
    if (buf && pool && pages) {
        for (size_t i = 0; i < pages * 512; i++) buf[i] = i;
        best = 1e30;
        for (int it = -1; it < iters; it++) { /* it = -1: warm-up (page faults, a cache filled) */
            double t0 = now();
            ml_pool_run(pool, (int64_t)pages, read_pages, buf);
            double dt = now() - t0;
            if (it >= 0 && dt < best) best = dt;
        }
    }
    if (pool) ml_pool_free(pool);
    free(buf);
    return best > 0 ? (double)(pages * 4096) / best / 1e9 : -1.0;
}

/* Cold runs (evict_mib > 0): before each timed product the pool's threads read evict_mib MiB with
 * read_pages (the caller sizes it from the machine's last-level cache: a 260 MiB L3 keeps a 128
 * MiB buffer's worth of weights) so the weights come from memory, as in a forward pass where every
 * matrix is used once per token. Reads, not memset: a large memset uses non-temporal stores,
 * which bypass the caches and evict nothing. */

typedef struct {
    const ml_kernel_table *k;
    int fmt, nb;
    const uint8_t *w;      /* rows of nb blocks: 32 bytes (Q8_0) or 16 bytes (Q4_0) per block */
    const float *wd;
    const int8_t *x;
    const float *xd;
    float *y;
} matvec_job;

/* What forward.c's decode runs: the packed GEMM with one token, over groups of 8 rows */
typedef struct {
    const ml_kernel_table *k;
    const ml_matrix *m;
    const int8_t *x;
    const float *xd;
    const int32_t *xs;
    float *y;
} packed_job;

static void matvec_groups(void *arg, int64_t g0, int64_t g1) {
    const packed_job *j = arg;
    ml_gemm8_groups(j->k, j->m, g0, g1, 1, &j->x, &j->xd, &j->xs, j->y, ML_PACK);
}

static void matvec_rows(void *arg, int64_t r0, int64_t r1) {
    const matvec_job *j = arg;
    size_t row_bytes = (size_t)j->nb * (j->fmt == ML_FMT_Q8_0 ? 32u : 16u);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = j->w + (size_t)r * row_bytes;
        const float *wd = j->wd + (size_t)r * (size_t)j->nb;
        j->y[r] = j->fmt == ML_FMT_Q8_0 ? j->k->dot_q8_0(j->nb, (const int8_t *)w, wd, j->x, j->xd)
                                        : j->k->dot_q4_0(j->nb, w, wd, j->x, j->xd);
    }
}

/* Seconds per matrix-vector product (best of iters), cold (weights from memory) or not; fmt
 * ML_FMT_Q8_0 or ML_FMT_Q4_0; negative on an ISA that cannot run here or a failed allocation.
 * The caller divides weight bytes by it. As forward.c: the packed GEMM where the table has one
 * and rows % 8 == 0 (the same bytes, repacked), else a dot per row. */
ML_API double mlrt_bench_matvec(const char *isa, int fmt, int rows, int cols, int threads, int iters,
                                int evict_mib) {
    const ml_kernel_table *k = ml_kernels_named(isa);
    if (!k || cols % QK || rows <= 0 || (fmt != ML_FMT_Q8_0 && fmt != ML_FMT_Q4_0)) return -1.0;
    int nb = cols / QK;
    size_t wbytes = (size_t)rows * (size_t)nb * (fmt == ML_FMT_Q8_0 ? 32u : 16u);
    uint8_t *w = malloc(wbytes);
    float *wd = malloc((size_t)rows * (size_t)nb * sizeof(float));
    int8_t *x = malloc((size_t)cols);
    float *xd = malloc((size_t)nb * sizeof(float));
    float *y = malloc((size_t)rows * sizeof(float));
    struct ml_pool *pool = ml_pool_new(threads);
    size_t evict = (size_t)(evict_mib > 0 ? evict_mib : 0) << 20;
    uint8_t *junk = evict ? malloc(evict) : NULL;
    if (junk) memset(junk, 1, evict); /* real pages: an untouched buffer reads one zero page */
    double best = -1.0;
    if (w && wd && x && xd && y && pool && (junk || !evict)) {
        uint32_t s = 12345u;
        for (size_t i = 0; i < wbytes; i++) w[i] = (uint8_t)(int8_t)((int)(next(&s) % 255u) - 127);  /* no -128 */
        for (size_t i = 0; i < (size_t)rows * (size_t)nb; i++)
            wd[i] = ml_f16_to_f32(ml_f32_to_f16(1e-3f * (float)(next(&s) % 100u))); /* f16 scales */
        for (int i = 0; i < cols; i++) x[i] = (int8_t)((int)(next(&s) % 255u) - 127);
        for (int i = 0; i < nb; i++) xd[i] = 1e-2f;
        matvec_job job = {k, fmt, nb, w, wd, x, xd, y};
        ml_matrix m = {.fmt = fmt, .rows = rows, .cols = cols, .q = w, .d = wd};
        int32_t *xs = malloc((size_t)nb * sizeof(int32_t));
        uint8_t *pq = k->gemm8_q8_0 && rows % ML_PACK == 0 ? malloc(ml_packed_q_bytes(&m)) : NULL;
        uint16_t *pd = pq ? malloc(ml_packed_d_bytes(&m, 1)) : NULL;
        if (pq && pd && xs) { /* f16 scales, as the bench models' files (the values are f16-exact) */
            ml_pack_groups(&m, 0, rows / ML_PACK, pq, pd, 1);
            ml_block_sums(x, nb, xs);
            m.pq = pq, m.pd = pd, m.pd_f16 = 1;
        }
        packed_job pj = {k, &m, x, xd, xs, y};
        best = 1e30;
        for (int it = 0; it < iters; it++) {
            if (evict) ml_pool_run(pool, (int64_t)(evict / 4096), read_pages, junk);
            double t0 = now();
            if (m.pq) ml_pool_run(pool, rows / ML_PACK, matvec_groups, &pj);
            else ml_pool_run(pool, rows, matvec_rows, &job);
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        free(xs);
        free(pq);
        free(pd);
    }
    if (pool) ml_pool_free(pool);
    free(junk);
    free(w);
    free(wd);
    free(x);
    free(xd);
    free(y);
    return best;
}

/* Nanoseconds per call of one kernel on n values (in cache): op "quantize_q8_0", "dot_q8_0",
 * "dot_q4_0", or "dot4_q8_0", "dot4_q4_0" (one weight row against four activation rows: a call
 * does four dots). Negative if the ISA or op is unknown. */
ML_API double mlrt_bench_kernel(const char *isa, const char *op, int n, int iters) {
    const ml_kernel_table *k = ml_kernels_named(isa);
    if (!k || n <= 0 || n % QK) return -1.0;
    int nb = n / QK;
    float *xf = malloc((size_t)n * sizeof(float));
    int8_t *q = malloc((size_t)n * 4); /* four activation rows for dot4 */
    uint8_t *w = malloc((size_t)n);
    float *d = malloc((size_t)nb * 4 * sizeof(float));
    double best = -1.0;
    if (xf && q && w && d) {
        uint32_t s = 777u;
        for (int i = 0; i < n; i++) xf[i] = (float)((int)(next(&s) % 2001u) - 1000) * 1e-3f;
        for (int i = 0; i < n; i++) w[i] = (uint8_t)(int8_t)((int)(next(&s) % 255u) - 127);
        for (int r = 0; r < 4; r++) k->quantize_q8_0(xf, n, q + (size_t)r * n, d + (size_t)r * nb);
        const int8_t *xs[4] = {q, q + n, q + 2 * (size_t)n, q + 3 * (size_t)n};
        const float *xds[4] = {d, d + nb, d + 2 * nb, d + 3 * nb};
        float y[4];
        int which = !strcmp(op, "quantize_q8_0") ? 0
                  : !strcmp(op, "dot_q8_0")    ? 1
                  : !strcmp(op, "dot_q4_0")    ? 2
                  : !strcmp(op, "dot4_q8_0")   ? 3
                  : !strcmp(op, "dot4_q4_0")   ? 4
                                               : -1;
        if (which >= 0) {
            volatile float sink = 0.0f;
            best = 1e30;
            int reps = 2000;
            for (int it = 0; it < iters; it++) {
                double t0 = now();
                for (int r = 0; r < reps; r++) {
                    if (which == 0) k->quantize_q8_0(xf, n, q, d);
                    else if (which == 1) sink += k->dot_q8_0(nb, (const int8_t *)w, d, q, d);
                    else if (which == 2) sink += k->dot_q4_0(nb, w, d, q, d);
                    else {
                        if (which == 3) k->dot4_q8_0(nb, (const int8_t *)w, d, xs, xds, y);
                        else k->dot4_q4_0(nb, w, d, xs, xds, y);
                        sink += y[0] + y[3];
                    }
                }
                double dt = (now() - t0) / reps;
                if (dt < best) best = dt;
            }
            (void)sink;
            best *= 1e9;
        }
    }
    free(xf);
    free(q);
    free(w);
    free(d);
    return best;
}
