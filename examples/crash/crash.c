/* crash.c: a deliberately broken runtime for mlconf's worker isolation (tests/test_native_backend.py).
 *
 * It exports part of the C ABI of backends/native/include/mlrt.h:
 *   ml_check   segfaults when the file name (the part after the last '/') contains "crash", never
 *              returns when it contains "hang"; otherwise ML_E_IO for a path it cannot open or a
 *              folder, ML_OK for a file starting with "MLB1", ML_E_FORMAT for anything else (a
 *              loader that checks the magic only: it passes some loader cases and fails others);
 *   ml_version, ml_isa;
 *   with -DWITH_TOKENIZER also ml_tok_load (always ML_E_UNSUPPORTED) and ml_tok_free.
 * The symbols it does not export (ml_load, ml_quantize_q8_0, ...) are capabilities mlconf must
 * report as unsupported.
 *
 *   gcc -std=c11 -shared -fPIC -I backends/native/include examples/crash/crash.c -o crash.so
 *   mlconf run -b lib:./crash.so --area loader
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mlrt.h"

const char *ml_version(void) { return "crash 1.0 (a test library that crashes and hangs on purpose)"; }

const char *ml_isa(void) { return "scalar"; }

static int fail(char *reason, size_t reason_len, int status, const char *path, const char *what) {
    if (reason && reason_len)
        snprintf(reason, reason_len, "%s: %s", path, what);
    return status;
}

int ml_check(const char *path, char *reason, size_t reason_len) {
    if (!path)
        return ML_E_ARG;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (strstr(name, "crash")) {
        volatile int *volatile p = NULL; /* opaque to the optimizer: a real SIGSEGV, not a trap */
        *p = 1;
    }
    if (strstr(name, "hang")) {
        for (;;)
            sleep(1);
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK);   /* a FIFO must not block (decision loader.special_files) */
    if (fd < 0)
        return fail(reason, reason_len, ML_E_IO, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(reason, reason_len, ML_E_IO, path, "not a regular file");
    }
    char magic[4];
    ssize_t n = read(fd, magic, sizeof magic);
    close(fd);
    if (n != 4 || memcmp(magic, "MLB1", 4) != 0)
        return fail(reason, reason_len, ML_E_FORMAT, path, "magic is not MLB1");
    return fail(reason, reason_len, ML_OK, path, "magic MLB1 (the only rule this library checks)");
}

#ifdef WITH_TOKENIZER
int ml_tok_load(const char *path, int32_t model_vocab, ml_tokenizer **out, char *reason, size_t reason_len) {
    (void)model_vocab;
    if (out)
        *out = NULL;
    return fail(reason, reason_len, ML_E_UNSUPPORTED, path, "this test library has no tokenizer");
}

void ml_tok_free(ml_tokenizer *t) { (void)t; }
#endif
