/* gguf_main.c: the GGUF loader driver of tests/test_gguf_rules.py, linked with the library's sources
 * (plain, or under AddressSanitizer + UBSan).
 *
 *   gguf_main [--limit PER_BYTE EXTRA] FILE...
 *
 * For each FILE, one line: "<check status> <rule or -> <load status, model reading> <float> <ternary>"
 * (ml_embed_check_rule, then ml_embed_load_reading in each reading, every embedder freed). With
 * --limit each file runs in a forked child whose RLIMIT_DATA leaves PER_BYTE bytes per byte of the
 * file plus EXTRA to allocate beyond what the fresh child holds (decision gguf.memory): a reader
 * that allocated more gets ML_E_NOMEM, printed as status 5. A child that dies prints "died SIG".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mlrt.h"

static long long vm_data(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmData:", 7) == 0) kb = atoll(line + 7);
    if (f) fclose(f);
    return kb * 1024;
}

static void one(const char *path) {
    char rule[128] = "", reason[1024];
    int st = ml_embed_check_rule(path, rule, sizeof rule, reason, sizeof reason);
    printf("%d %s", st, rule[0] ? rule : "-");
    for (int reading = ML_READ_MODEL; reading <= ML_READ_TERNARY; reading++) {
        ml_embedder *e = NULL;
        printf(" %d", ml_embed_load_reading(path, 1, reading, &e, reason, sizeof reason));
        ml_embed_free(e);
    }
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    int i = 1;
    long long per_byte = -1, extra = 0;
    if (argc > 3 && strcmp(argv[1], "--limit") == 0) per_byte = atoll(argv[2]), extra = atoll(argv[3]), i = 4;
    for (; i < argc; i++) {
        if (per_byte < 0) {
            one(argv[i]);
            continue;
        }
        struct stat st;
        long long size = lstat(argv[i], &st) == 0 && S_ISREG(st.st_mode) ? (long long)st.st_size : 0;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            struct rlimit r;
            getrlimit(RLIMIT_DATA, &r);
            r.rlim_cur = (rlim_t)(vm_data() + per_byte * size + extra);
            if (setrlimit(RLIMIT_DATA, &r) != 0) return perror("setrlimit"), 2;
            one(argv[i]);
            _exit(0);
        }
        int ws;
        if (pid < 0 || waitpid(pid, &ws, 0) != pid) return perror("fork"), 2;
        if (!WIFEXITED(ws) || WEXITSTATUS(ws)) printf("died %d\n", WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
    }
    return 0;
}
