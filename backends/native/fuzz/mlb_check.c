/* libFuzzer target: ml_check (the .mlb loader's every rule) on arbitrary bytes, and for a file
 * it accepts the full load (ctx 1: every size the state takes) and one token's forward pass.
 *
 * The loader takes a path, so the input is written to a memfd and read back through
 * /proc/self/fd/N: no file system traffic, one descriptor reused for every input. A crash, a
 * sanitizer report or a hang is a finding; any status is a valid answer. Build and run:
 * backends/native/fuzz/README.md. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mlrt.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    if (!path) return 0;
    char reason[512];
    if (ml_check(path, reason, sizeof reason) != ML_OK) return 0;
    ml_model *m = NULL;
    if (ml_load(path, 1, 1, &m, reason, sizeof reason) != ML_OK || !m) return 0;
    float *logits = malloc((size_t)ml_vocab(m) * sizeof *logits);
    int32_t token = 1;     /* vocab >= 3 */
    if (logits) (void)ml_forward(m, &token, 1, 0, logits);
    free(logits);
    ml_free(m);
    return 0;
}
