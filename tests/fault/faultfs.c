/* faultfs: an LD_PRELOAD shim that makes one chosen storage call of a process
 * fail, come up short or stall, for the fault-injection tests
 * (tests/py/test_faults.py). Only calls on files under FAULT_DIR count, so
 * the server's own stderr and the model's mmap are left alone.
 *
 * Call classes:  write   write, pwrite, pwritev, writev (and their 64 forms)
 *                sync    fsync, fdatasync
 *                rename  rename, renameat
 *                creat   open/openat with O_CREAT
 *                trunc   ftruncate
 * Environment:
 *   FAULT_DIR    path prefix whose files count (required; unset = the shim is inert)
 *   FAULT_LOG    file that gets one line "class ordinal path" per counted call
 *   FAULT_CLASS  the class to fault, FAULT_AT its 1-based ordinal in this process
 *   FAULT_MODE   fail (default): -1 with FAULT_ERRNO (EIO, ENOSPC, EDQUOT ...);
 *                short: a write moves half its bytes (at least 1) and returns that;
 *                delay: sleeps FAULT_DELAY_MS, then does the call
 *   FAULT_STICKY 1: every later call of the class fails too (a disk that stays full)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum { C_WRITE, C_SYNC, C_RENAME, C_CREAT, C_TRUNC, C_N };
static const char *const class_names[C_N] = {"write", "sync", "rename", "creat", "trunc"};
static long counters[C_N];

enum action { GO, FAIL, SHORT };

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static int fault_errno(void) {
    const char *e = env("FAULT_ERRNO");
    if (!e || !strcmp(e, "EIO")) return EIO;
    if (!strcmp(e, "ENOSPC")) return ENOSPC;
    if (!strcmp(e, "EDQUOT")) return EDQUOT;
    if (!strcmp(e, "EROFS")) return EROFS;
    return atoi(e) > 0 ? atoi(e) : EIO;
}

static int under_dir(const char *path) {
    const char *dir = env("FAULT_DIR");
    if (!dir || !path) return 0;
    char abs[PATH_MAX];
    if (path[0] != '/') { /* the server may be given a relative data dir */
        if (!getcwd(abs, sizeof abs)) return 0;
        size_t n = strlen(abs);
        snprintf(abs + n, sizeof abs - n, "/%s", path);
        path = abs;
    }
    return !strncmp(path, dir, strlen(dir));
}

static int fd_path(int fd, char *out, size_t n) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, out, n - 1);
    if (k < 0) return -1;
    out[k] = 0;
    return 0;
}

/* Counts the call when path is under FAULT_DIR and says what to do with it. */
static enum action decide(int cls, const char *path) {
    if (!under_dir(path)) return GO;
    long n = __atomic_add_fetch(&counters[cls], 1, __ATOMIC_SEQ_CST);
    const char *log = env("FAULT_LOG");
    if (log) {
        int saved = errno;
        FILE *f = fopen(log, "a"); /* not under FAULT_DIR: not counted */
        if (f) {
            fprintf(f, "%s %ld %s\n", class_names[cls], n, path);
            fclose(f);
        }
        errno = saved;
    }
    const char *want = env("FAULT_CLASS"), *at = env("FAULT_AT");
    if (!want || !at || strcmp(want, class_names[cls])) return GO;
    long k = atol(at);
    const char *sticky = env("FAULT_STICKY");
    if (n != k && !(sticky && *sticky == '1' && n > k)) return GO;
    const char *mode = env("FAULT_MODE");
    if (mode && !strcmp(mode, "delay")) {
        const char *ms = env("FAULT_DELAY_MS");
        long d = ms ? atol(ms) : 1000;
        struct timespec ts = {d / 1000, (d % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        return GO;
    }
    fprintf(stderr, "faultfs: %s call %ld on %s: %s\n", class_names[cls], n, path,
            mode && !strcmp(mode, "short") ? "short" : "fail");
    return mode && !strcmp(mode, "short") ? SHORT : FAIL;
}

static enum action decide_fd(int cls, int fd) {
    char p[PATH_MAX];
    return fd_path(fd, p, sizeof p) ? GO : decide(cls, p);
}

/* The next definition of a libc function, looked up once. */
#define REAL(name)                                                                               \
    static __typeof__(&name) real_##name;                                                        \
    if (!real_##name) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

static size_t half(size_t n) { return n > 1 ? n / 2 : n; }

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(write);
    switch (decide_fd(C_WRITE, fd)) {
    case FAIL: errno = fault_errno(); return -1;
    case SHORT: return real_write(fd, buf, half(n));
    default: return real_write(fd, buf, n);
    }
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite);
    switch (decide_fd(C_WRITE, fd)) {
    case FAIL: errno = fault_errno(); return -1;
    case SHORT: return real_pwrite(fd, buf, half(n), off);
    default: return real_pwrite(fd, buf, n, off);
    }
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }

/* A short vectored write: the first half of the total, as one plain write. */
static ssize_t short_vec(int fd, const struct iovec *iov, int cnt, off_t off, int positioned) {
    REAL(pwrite);
    REAL(write);
    size_t total = 0;
    for (int i = 0; i < cnt; i++) total += iov[i].iov_len;
    size_t want = half(total), got = 0;
    for (int i = 0; i < cnt && got < want; i++) {
        size_t k = iov[i].iov_len < want - got ? iov[i].iov_len : want - got;
        ssize_t w = positioned ? real_pwrite(fd, iov[i].iov_base, k, off + (off_t)got)
                               : real_write(fd, iov[i].iov_base, k);
        if (w < 0) return got ? (ssize_t)got : -1;
        got += (size_t)w;
        if ((size_t)w < k) break;
    }
    return (ssize_t)got;
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    REAL(pwritev);
    switch (decide_fd(C_WRITE, fd)) {
    case FAIL: errno = fault_errno(); return -1;
    case SHORT: return short_vec(fd, iov, cnt, off, 1);
    default: return real_pwritev(fd, iov, cnt, off);
    }
}
ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) { return pwritev(fd, iov, cnt, off); }

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    REAL(writev);
    switch (decide_fd(C_WRITE, fd)) {
    case FAIL: errno = fault_errno(); return -1;
    case SHORT: return short_vec(fd, iov, cnt, 0, 0);
    default: return real_writev(fd, iov, cnt);
    }
}

int fsync(int fd) {
    REAL(fsync);
    if (decide_fd(C_SYNC, fd) != GO) return errno = fault_errno(), -1;
    return real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync);
    if (decide_fd(C_SYNC, fd) != GO) return errno = fault_errno(), -1;
    return real_fdatasync(fd);
}

int ftruncate(int fd, off_t len) {
    REAL(ftruncate);
    if (decide_fd(C_TRUNC, fd) != GO) return errno = fault_errno(), -1;
    return real_ftruncate(fd, len);
}
int ftruncate64(int fd, off_t len) { return ftruncate(fd, len); }

int rename(const char *from, const char *to) {
    REAL(rename);
    if (decide(C_RENAME, to) != GO) return errno = fault_errno(), -1;
    return real_rename(from, to);
}

int renameat(int dfd, const char *from, int tdfd, const char *to) {
    REAL(renameat);
    if (decide(C_RENAME, to) != GO) return errno = fault_errno(), -1;
    return real_renameat(dfd, from, tdfd, to);
}

/* open with O_CREAT: the mode argument is there only then */
static int open_common(int dfd, const char *path, int flags, mode_t mode, int at) {
    REAL(open);
    REAL(openat);
    if ((flags & O_CREAT) && decide(C_CREAT, path) != GO) return errno = fault_errno(), -1;
    return at ? real_openat(dfd, path, flags, mode) : real_open(path, flags, mode);
}

/* The mode argument of an open, there only with O_CREAT or O_TMPFILE. */
#define TAKE_MODE(flags, mode)                                                                   \
    do {                                                                                         \
        if ((flags) & (O_CREAT | O_TMPFILE)) {                                                   \
            va_list ap;                                                                          \
            va_start(ap, flags);                                                                 \
            mode = (mode_t)va_arg(ap, int);                                                      \
            va_end(ap);                                                                          \
        }                                                                                        \
    } while (0)

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    TAKE_MODE(flags, mode);
    return open_common(AT_FDCWD, path, flags, mode, 0);
}

int open64(const char *path, int flags, ...) {
    mode_t mode = 0;
    TAKE_MODE(flags, mode);
    return open_common(AT_FDCWD, path, flags, mode, 0);
}

int openat(int dfd, const char *path, int flags, ...) {
    mode_t mode = 0;
    TAKE_MODE(flags, mode);
    return open_common(dfd, path, flags, mode, 1);
}
