/* A disk whose flushes are slower: preloaded into a process (LD_PRELOAD), this makes each
 * fsync() and fdatasync() wait BENCH_FSYNC_DELAY_US microseconds more once the real call
 * has returned, sleeping (no CPU), as a slower device's flush would. bench/charges.py
 * --fsync-delay-ms builds it and preloads it into the servers it starts; a PostgreSQL
 * server is started with it by hand (see bench/charges.py). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

static void wait_more(void) {
    const char *text = getenv("BENCH_FSYNC_DELAY_US");
    long us = text ? atol(text) : 0;
    if (us <= 0) return;
    struct timespec left = {us / 1000000L, (us % 1000000L) * 1000L};
    while (nanosleep(&left, &left) == -1 && errno == EINTR) {
    }
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int result = real(fd);
    wait_more();
    return result;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int result = real(fd);
    wait_more();
    return result;
}
