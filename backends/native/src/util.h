/* util.h: export macro, overflow-checked size arithmetic, reason formatting. */
#ifndef MLRT_UTIL_H
#define MLRT_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <sys/stat.h>
#include <unistd.h>

#include "../include/mlrt.h"

/* build.py compiles with -fvisibility=hidden: only the functions of include/mlrt.h carry this. */
#define ML_API __attribute__((visibility("default")))

/* Sticky-overflow arithmetic: a chain of size computations reads like plain arithmetic and is
 * checked once at the end (*overflow stays true once any step wrapped). */
static inline uint64_t ml_mul_u64(uint64_t a, uint64_t b, bool *overflow) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) *overflow = true;
    return r;
}

static inline uint64_t ml_add_u64(uint64_t a, uint64_t b, bool *overflow) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) *overflow = true;
    return r;
}

/* n rounded up to a multiple of a (a power of two). */
static inline uint64_t ml_align_u64(uint64_t n, uint64_t a, bool *overflow) {
    return ml_add_u64(n, a - 1, overflow) & ~(a - 1);
}

/* The same on size_t, which is 32 bits on -m32 targets. */
static inline size_t ml_mul_size(size_t a, size_t b, bool *overflow) {
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) *overflow = true;
    return r;
}

static inline size_t ml_add_size(size_t a, size_t b, bool *overflow) {
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) *overflow = true;
    return r;
}

/* A uint64_t that must fit in size_t (a byte count or index of memory on this target). */
static inline size_t ml_size_of_u64(uint64_t v, bool *overflow) {
    if (v > (uint64_t)SIZE_MAX) *overflow = true;
    return (size_t)v;
}

/* n bytes (n > 0) on a 64-byte (cache line) boundary, freed by free(); NULL if there is no
 * memory. For rows that SIMD kernels load whole: malloc's 16-byte alignment split every 64-byte
 * load of a row across two lines, and such loads go at half the rate (the bitnet prefill GEMM:
 * 393 -> 233 GMAC/s on one AMD EPYC core, rows 16 bytes off a line). */
static inline void *ml_alloc_aligned(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 1) == 0 ? p : NULL;
}

/* n zeroed bytes on a 64-byte boundary, freed by ml_free_aligned only; NULL if there is no memory.
 * calloc underneath, so a large buffer (a KV cache of max_seq positions) stays untouched pages
 * until it is used: zeroing it at allocation faulted in every page (a forward fixture's load went
 * from 0.1 to 190 ms). The pointer calloc gave is kept just below the aligned one. */
static inline void *ml_calloc_aligned(size_t n) {
    if (n > SIZE_MAX - 64) return NULL;
    unsigned char *base = calloc(1, n + 64);
    if (!base) return NULL;
    unsigned char *p = base + 64 - (uintptr_t)base % 64; /* calloc's 16-byte alignment leaves room below */
    memcpy(p - sizeof base, &base, sizeof base);
    return p;
}

static inline void ml_free_aligned(void *p) {
    if (!p) return;
    void *base;
    memcpy(&base, (unsigned char *)p - sizeof base, sizeof base);
    free(base);
}

/* n bytes (n > 0) for the packed weights and the bandwidth bench, on 2 MiB pages where the OS
 * gives them on request (Linux's transparent huge pages in `madvise` mode): decode streams the
 * whole of it for every token, and 4 KiB pages cost a TLB miss every 4 KiB (1B-shape Q4_0 decode
 * 1.05-1.07x, AMD EPYC). Freed by free(); NULL if there is no memory. */
static inline void *ml_alloc_large(size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    enum { HUGE = 2u << 20 };
    void *p = NULL;
    if (n >= HUGE) {
        if (posix_memalign(&p, HUGE, n) != 0) return NULL;
        (void)madvise(p, n - n % HUGE, MADV_HUGEPAGE); /* a hint: refused, it is only slower */
        return p;
    }
#endif
    return ml_alloc_aligned(n);
}

/* Format into a caller's reason buffer (NULL or 0 bytes: nothing), always NUL-terminated. */
__attribute__((format(printf, 3, 4)))
static inline void ml_reason(char *reason, size_t reason_len, const char *fmt, ...) {
    if (!reason || !reason_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, reason_len, fmt, ap);
    va_end(ap);
}

/* A validating loader's reason buffer: ml_fail fills it as "PATH: <what> [rule]" and returns the
 * status, so that every refusal names the file, the field and the rule (loader.c, tok_load.c).
 * `rule`, when set (ml_check_rule, ml_tok_check_rule), receives the bare rule id. */
typedef struct {
    const char *path;
    char *reason;
    size_t reason_len;
    char *rule;
    size_t rule_len;
} ml_report;

__attribute__((format(printf, 4, 5)))
static inline int ml_fail(const ml_report *r, int status, const char *rule, const char *fmt, ...) {
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ml_reason(r->reason, r->reason_len, "%s: %s [%s]", r->path, what, rule);
    ml_reason(r->rule, r->rule_len, "%s", rule);
    return status;
}

/* What a file that is not a regular one is, for a reason text (decision loader.special_files). */
static inline const char *ml_file_kind(mode_t m) {
    return S_ISDIR(m) ? "is a directory" : S_ISFIFO(m) ? "is a FIFO" : S_ISCHR(m) ? "is a character device"
           : S_ISBLK(m) ? "is a block device" : S_ISSOCK(m) ? "is a socket" : "is not a regular file";
}

/* Open r->path read-only as a regular file: *fd and *st on ML_OK; else ML_E_IO "io.open" with
 * the reason (missing, unreadable, a directory, a device). O_NONBLOCK: a FIFO must not hang the
 * loader (no effect on regular files). */
static inline int ml_open_regular(const ml_report *r, int *fd, struct stat *st) {
    *fd = open(r->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0) return ml_fail(r, ML_E_IO, "io.open", "cannot open: %s", strerror(errno));
    if (fstat(*fd, st) != 0) {
        int e = errno;
        close(*fd);
        return ml_fail(r, ML_E_IO, "io.open", "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {   /* decision loader.special_files */
        close(*fd);
        return ml_fail(r, ML_E_IO, "io.open", "cannot open: %s", ml_file_kind(st->st_mode));
    }
    return ML_OK;
}

/* Little-endian uint32 at p (any alignment). */
static inline uint32_t ml_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
