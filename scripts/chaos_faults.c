// LD_PRELOAD shim for scripts/chaos: the faults an instance cannot be given from outside on this
// machine (no iptables, dm-delay or libfaketime): its own network path to the brokers, a slow
// disk and a jump of its wall clock. scripts/chaos.py builds it with gcc and preloads it into
// every instance.
//
// Environment (read once at load):
//   CHAOS_REDIRECT   "19092=41001,19093=41002": connect() to 127.0.0.1:<from> goes to <to>
//                    (the instance's own proxy, which scripts/chaos.py can blackhole);
//   CHAOS_CTL_DIR    a directory polled every 50 ms for two files, each an integer:
//                    clock-offset-ms  added to CLOCK_REALTIME (clock_gettime, gettimeofday, time);
//                    slow-disk-ms     each fsync/fdatasync/sync_file_range of a file under
//                                     CHAOS_SLOW_PREFIX sleeps this long, each write a tenth;
//   CHAOS_SLOW_PREFIX  the path whose files a slow disk slows (the state dir).
// Monotonic clocks are left alone: a wall-clock jump does not move them on a real machine.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <threads.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_REDIRECTS 8

static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_clock_gettime)(clockid_t, struct timespec *);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_sync_file_range)(int, off64_t, off64_t, unsigned int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_cnd_timedwait)(cnd_t *, mtx_t *, const struct timespec *);
static int (*real_pthread_cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);

static unsigned short redirect_from[MAX_REDIRECTS], redirect_to[MAX_REDIRECTS];
static int redirects;
static char ctl_dir[512], slow_prefix[512];
static size_t slow_prefix_len;

// Each real_* is resolved in the constructor; a call before it (mimalloc's and libstdc++'s own
// initialisers read the clock and write first) goes to the system call, since dlsym itself
// allocates and would come back here.
#define CALL(name, ...) (real_##name ? real_##name(__VA_ARGS__) : syscall(SYS_##name, __VA_ARGS__))

// Written by the poller thread only, read by every thread: values, no ordering needed.
static _Atomic long long clock_offset_ms;
static _Atomic long long slow_disk_ms;

static long long read_ll(const char *name) {
    char path[600], buf[64];
    snprintf(path, sizeof path, "%s/%s", ctl_dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    return strtoll(buf, NULL, 10);
}

static void *poll_ctl(void *arg) {
    (void)arg;
    struct timespec tick = {0, 50 * 1000 * 1000};
    for (;;) {
        atomic_store_explicit(&clock_offset_ms, read_ll("clock-offset-ms"), memory_order_relaxed);
        atomic_store_explicit(&slow_disk_ms, read_ll("slow-disk-ms"), memory_order_relaxed);
        nanosleep(&tick, NULL);
    }
    return NULL;
}

__attribute__((constructor)) static void init(void) {
    real_connect = dlsym(RTLD_NEXT, "connect");
    real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_sync_file_range = dlsym(RTLD_NEXT, "sync_file_range");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_cnd_timedwait = dlsym(RTLD_NEXT, "cnd_timedwait");
    real_pthread_cond_timedwait = dlsym(RTLD_NEXT, "pthread_cond_timedwait");
    const char *r = getenv("CHAOS_REDIRECT");
    while (r && *r && redirects < MAX_REDIRECTS) {
        unsigned from, to;
        if (sscanf(r, "%u=%u", &from, &to) != 2) break;
        redirect_from[redirects] = (unsigned short)from;
        redirect_to[redirects] = (unsigned short)to;
        redirects++;
        r = strchr(r, ',');
        if (r) r++;
    }
    const char *c = getenv("CHAOS_CTL_DIR");
    const char *p = getenv("CHAOS_SLOW_PREFIX");
    if (p) {
        snprintf(slow_prefix, sizeof slow_prefix, "%s", p);
        slow_prefix_len = strlen(slow_prefix);
    }
    if (c) {
        snprintf(ctl_dir, sizeof ctl_dir, "%s", c);
        atomic_store(&clock_offset_ms, read_ll("clock-offset-ms"));
        atomic_store(&slow_disk_ms, read_ll("slow-disk-ms"));
        pthread_t t;
        if (pthread_create(&t, NULL, poll_ctl, NULL) == 0) pthread_detach(t);
    }
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        unsigned short port = ntohs(in->sin_port);
        for (int i = 0; i < redirects; i++) {
            if (port == redirect_from[i] && in->sin_addr.s_addr == htonl(INADDR_LOOPBACK)) {
                struct sockaddr_in to = *in;
                to.sin_port = htons(redirect_to[i]);
                return CALL(connect, fd, (const struct sockaddr *)&to, sizeof to);
            }
        }
    }
    return CALL(connect, fd, addr, len);
}

static void shift_by(struct timespec *ts, long long off) {
    if (!off) return;
    long long ns = (long long)ts->tv_nsec + (off % 1000) * 1000000LL;
    ts->tv_sec += off / 1000 + ns / 1000000000LL;
    ns %= 1000000000LL;
    if (ns < 0) {
        ns += 1000000000LL;
        ts->tv_sec -= 1;
    }
    ts->tv_nsec = ns;
}

static void shift(struct timespec *ts) {
    shift_by(ts, atomic_load_explicit(&clock_offset_ms, memory_order_relaxed));
}

// A deadline on the shifted wall clock (librdkafka's and RocksDB's timed waits compute theirs
// from it) goes to the kernel on the real one, which only a real clock step would move too.
// A real step also stretches a wait in flight by its size (POSIX: CLOCK_REALTIME deadlines
// follow the clock); that is not modelled: a wait uses the offset at its start.
static struct timespec unshifted(const struct timespec *ts) {
    struct timespec k = *ts;
    shift_by(&k, -atomic_load_explicit(&clock_offset_ms, memory_order_relaxed));
    return k;
}

int cnd_timedwait(cnd_t *c, mtx_t *m, const struct timespec *ts) {
    if (!real_cnd_timedwait) real_cnd_timedwait = dlsym(RTLD_NEXT, "cnd_timedwait");
    struct timespec k = unshifted(ts);
    return real_cnd_timedwait(c, m, &k);
}

int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *ts) {
    if (!real_pthread_cond_timedwait) real_pthread_cond_timedwait = dlsym(RTLD_NEXT, "pthread_cond_timedwait");
    // glibc keeps the condvar's clock in bit 1 of __wrefs (1: CLOCK_MONOTONIC, left alone).
    if (c->__data.__wrefs & 2) return real_pthread_cond_timedwait(c, m, ts);
    struct timespec k = unshifted(ts);
    return real_pthread_cond_timedwait(c, m, &k);
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int rc = CALL(clock_gettime, clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) shift(ts);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}

// Sleeps `ms` when fd is a file under the slow prefix and the slow disk is on.
static void slow(int fd, long long divisor) {
    long long ms = atomic_load_explicit(&slow_disk_ms, memory_order_relaxed);
    if (ms <= 0 || !slow_prefix_len) return;
    char link[64], target[600];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return;
    target[n] = 0;
    if (strncmp(target, slow_prefix, slow_prefix_len) != 0) return;
    long long us = ms * 1000 / divisor;
    struct timespec d = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&d, NULL);
}

int fsync(int fd) {
    slow(fd, 1);
    return CALL(fsync, fd);
}

int fdatasync(int fd) {
    slow(fd, 1);
    return CALL(fdatasync, fd);
}

int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags) {
    slow(fd, 1);
    return CALL(sync_file_range, fd, off, n, flags);
}

ssize_t write(int fd, const void *buf, size_t n) {
    slow(fd, 10);
    return CALL(write, fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    slow(fd, 10);
    return CALL(pwrite64, fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    slow(fd, 10);
    return CALL(writev, fd, iov, cnt);
}
