/* A disk whose flushes are slower: preloaded into a process (LD_PRELOAD), this makes each
 * fsync() and fdatasync() wait BENCH_FSYNC_DELAY_US microseconds more once the real call
 * has returned, sleeping (no CPU), as a slower device's flush would; the real call's result
 * and errno are returned as they were. bench/charges.py --fsync-delay-ms builds it and
 * preloads it into the processes it starts. For a PostgreSQL server, build it by hand
 * (cc -O2 -shared -fPIC -o slow_fsync.so bench/slow_fsync.c -ldl) and start the server with
 * LD_PRELOAD=/path/to/slow_fsync.so and BENCH_FSYNC_DELAY_US in its environment. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

static struct timespec delay;
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);

__attribute__((constructor)) static void load(void) {
    const char *text = getenv("BENCH_FSYNC_DELAY_US");
    long us = text ? strtol(text, NULL, 10) : 0;
    if (us > 0) {
        delay.tv_sec = us / 1000000L;
        delay.tv_nsec = (us % 1000000L) * 1000L;
    }
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
}

static int slower(int result) {
    int saved = errno;
    struct timespec left = delay;
    if (left.tv_sec > 0 || left.tv_nsec > 0) {
        while (nanosleep(&left, &left) == -1 && errno == EINTR) {
        }
    }
    errno = saved;
    return result;
}

int fsync(int fd) { return slower(real_fsync(fd)); }

int fdatasync(int fd) { return slower(real_fdatasync(fd)); }
