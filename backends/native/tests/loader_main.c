/* loader_main.c: a driver of the native loader for tests/test_native_loader.py.
 *
 * Reads paths on stdin, one per line; for each prints "CHECK<TAB>LOAD<TAB>REASON": the statuses
 * of ml_check and of ml_load (ctx 1, one thread, then ml_free) and ml_check's reason. Built
 * against the 32-bit library (-m32, which 64-bit Python cannot load) and against the sanitizer
 * build (run with the ASan runtime preloaded), so it uses nothing but include/mlrt.h.
 */
#include <stdio.h>
#include <string.h>

#include "mlrt.h"

int main(void) {
    char path[4096], reason[1024], load_reason[1024];
    while (fgets(path, sizeof path, stdin)) {
        path[strcspn(path, "\n")] = '\0';
        int check = ml_check(path, reason, sizeof reason);
        ml_model *m = NULL;
        int load = ml_load(path, 1, 1, &m, load_reason, sizeof load_reason);
        if (m && (ml_vocab(m) < 3 || ml_ctx(m) != 1)) load = -1;   /* a loaded model must say so */
        if (m) ml_reset(m);
        ml_free(m);
        printf("%d\t%d\t%s\n", check, load, reason);
    }
    return 0;
}
