/* fuzz_file.h: the input of a libFuzzer target as a path a loader can open (a memfd, rewritten
 * for each input; /proc/self/fd/N names it). NULL when no memfd can be made. */
#ifndef MLRT_FUZZ_FILE_H
#define MLRT_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *fuzz_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("mlconf-fuzz", 0);
        if (fd < 0) return NULL;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return NULL;
    return path;
}

#endif
