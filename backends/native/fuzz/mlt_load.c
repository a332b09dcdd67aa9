/* libFuzzer target: ml_tok_load (the .mlt loader) on arbitrary bytes, then one encode of a
 * fixed text and a decode of ids 0..7 when the file is accepted (the tokenizer tables a loader
 * accepted must be safe to use). Build and run: backends/native/fuzz/README.md. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mlrt.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    if (!path) return 0;
    char reason[512];
    ml_tokenizer *t = NULL;
    if (ml_tok_load(path, 0, &t, reason, sizeof reason) != ML_OK || !t) return 0;
    static const char text[] = "Hello, world! 123 \xc3\xa9\xe4\xb8\xad \xf0\x9f\x98\x80  tabs\tand\nlines";
    int32_t ids[256];
    size_t n = 0;
    (void)ml_tok_encode(t, text, sizeof text - 1, ids, 256, &n);
    int32_t some[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    char out[1024];
    size_t len = 0;
    (void)ml_tok_decode(t, some, 8, out, sizeof out, &len);
    ml_tok_free(t);
    return 0;
}
