/* libFuzzer target: ml_embed_check_rule (every rule of specs/gguf.yaml) on arbitrary bytes, then
 * the load in each reading (I2_S dequantized, f32/f16 ternarized: every buffer a GGUF sizes), and
 * for a file the model reading accepts, one embedding of two tokens. Linked with libmlbitnet's
 * sources (backends/native/build.py FUZZ_LIBRARY). A crash, a sanitizer report, a leak or a hang is
 * a finding; any status is a valid answer. Build and run: backends/native/fuzz/README.md. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_file.h"
#include "mlrt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    if (!path) return 0;
    char rule[128], reason[512];
    if (ml_embed_check_rule(path, rule, sizeof rule, reason, sizeof reason) != ML_OK) return 0;
    for (int32_t reading = ML_READ_FLOAT; reading <= ML_READ_TERNARY; reading++) {
        ml_embedder *e = NULL;
        if (ml_embed_load_reading(path, 1, reading, &e, reason, sizeof reason) == ML_OK) ml_embed_free(e);
    }
    ml_embedder *e = NULL;
    if (ml_embed_load(path, 1, &e, reason, sizeof reason) != ML_OK || !e) return 0;
    float *out = malloc((size_t)ml_embed_dim(e) * sizeof *out);
    int32_t tokens[2] = {0, ml_embed_vocab(e) - 1};
    if (out) (void)ml_embed(e, tokens, 2, ML_POOL_MEAN, 1, out);
    free(out);
    ml_embed_free(e);
    return 0;
}
