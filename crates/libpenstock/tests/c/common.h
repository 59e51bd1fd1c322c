/* Helpers of the C tests: checks that say where they failed, the control descriptor's
 * line protocol, loopback sockets, a receiver thread, temporary files of known bytes. */
#ifndef PENSTOCK_TEST_COMMON_H
#define PENSTOCK_TEST_COMMON_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <penstock.h>

/* Not every test uses every helper. */
#define HELPER static __attribute__((unused))

static int failures = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,   \
                    __LINE__, #cond, penstock_last_error());                          \
            failures++;                                                               \
        }                                                                             \
    } while (0)

/* A call that must fail with `code` and leave a message containing `needle`. */
#define CHECK_ERR(call, code, needle)                                                 \
    do {                                                                              \
        long long got_ = (long long)(call);                                           \
        const char *msg_ = penstock_last_error();                                     \
        if (got_ != (code) || penstock_last_error_code() != (code) ||                 \
            strstr(msg_, (needle)) == NULL) {                                         \
            fprintf(stderr, "%s:%d: %s gave %lld, wanted %d; message %s (wanted %s)\n", \
                    __FILE__, __LINE__, #call, got_, (int)(code), msg_, (needle));    \
            failures++;                                                               \
        }                                                                             \
    } while (0)

#define DIE_UNLESS(cond)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: cannot go on: %s (errno %s; last error: %s)\n",   \
                    __FILE__, __LINE__, #cond, strerror(errno), penstock_last_error()); \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

HELPER int finish(const char *name) {
    if (failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

/* ---- bytes ------------------------------------------------------------------------------ */

HELPER unsigned char pattern_byte(size_t i) { return (unsigned char)(i * 7 + i / 4099); }

HELPER unsigned char *pattern(size_t n) {
    unsigned char *b = malloc(n ? n : 1);
    DIE_UNLESS(b != NULL);
    for (size_t i = 0; i < n; i++) b[i] = pattern_byte(i);
    return b;
}

/* A file of `n` pattern bytes under $TMPDIR; its path in `path` (at least 64 bytes). */
HELPER void make_file(char *path, size_t n) {
    const char *tmp = getenv("TMPDIR");
    snprintf(path, 64, "%s/penstock-c-XXXXXX", tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    DIE_UNLESS(fd >= 0);
    unsigned char *b = pattern(n);
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, b + off, n - off);
        DIE_UNLESS(w > 0);
        off += (size_t)w;
    }
    free(b);
    close(fd);
}

HELPER unsigned char *read_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    DIE_UNLESS(fd >= 0);
    struct stat st;
    DIE_UNLESS(fstat(fd, &st) == 0);
    unsigned char *b = malloc((size_t)st.st_size + 1);
    DIE_UNLESS(b != NULL);
    size_t off = 0;
    while (off < (size_t)st.st_size) {
        ssize_t r = read(fd, b + off, (size_t)st.st_size - off);
        DIE_UNLESS(r > 0);
        off += (size_t)r;
    }
    close(fd);
    *len = off;
    return b;
}

/* Whether `got` is the pattern's bytes [from, from + n). */
HELPER int is_pattern(const unsigned char *got, size_t n, size_t from) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != pattern_byte(from + i)) return 0;
    return 1;
}

/* ---- sockets ---------------------------------------------------------------------------- */

/* A TCP listener on 127.0.0.1 and a kernel-chosen port, written to *port. */
HELPER int tcp_listener(int *port) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    DIE_UNLESS(l >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    DIE_UNLESS(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    DIE_UNLESS(listen(l, 16) == 0);
    socklen_t len = sizeof a;
    DIE_UNLESS(getsockname(l, (struct sockaddr *)&a, &len) == 0);
    *port = ntohs(a.sin_port);
    return l;
}

HELPER int tcp_connect(int port) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    DIE_UNLESS(s >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    DIE_UNLESS(connect(s, (struct sockaddr *)&a, sizeof a) == 0);
    return s;
}

/* A connected pair over loopback TCP: *a is the connecting end, the return the accepted one. */
HELPER int tcp_pair(int *a) {
    int port;
    int l = tcp_listener(&port);
    *a = tcp_connect(port);
    int b = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    DIE_UNLESS(b >= 0);
    close(l);
    return b;
}

/* A receiver thread: reads a stream socket to EOF into a growing buffer. */
struct receiver {
    pthread_t thread;
    int fd;
    unsigned char *buf;
    size_t len, cap;
};

HELPER void *receive_all(void *arg) {
    struct receiver *r = arg;
    for (;;) {
        if (r->len == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 1 << 16;
            r->buf = realloc(r->buf, r->cap);
            DIE_UNLESS(r->buf != NULL);
        }
        ssize_t n = read(r->fd, r->buf + r->len, r->cap - r->len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        r->len += (size_t)n;
    }
    return NULL;
}

HELPER void receiver_start(struct receiver *r, int fd) {
    memset(r, 0, sizeof *r);
    r->fd = fd;
    DIE_UNLESS(pthread_create(&r->thread, NULL, receive_all, r) == 0);
}

/* A loopback TCP connection whose far end a receiver thread reads; the near end, to write
 * to (or to hand to penstock), is returned. */
HELPER int tcp_to_receiver(struct receiver *r) {
    int send_end;
    int recv_end = tcp_pair(&send_end);
    receiver_start(r, recv_end);
    return send_end;
}

/* Joins the receiver and closes its socket; the bytes stay in r->buf (free them). */
HELPER void receiver_join(struct receiver *r) {
    pthread_join(r->thread, NULL);
    close(r->fd);
}

/* ---- the control descriptor ------------------------------------------------------------ */

/* Sends one command line and reads its whole reply (one line, or the lines of a multi-line
 * reply up to its last, "DDD text") into `reply` (the last line only, without "\n"); the
 * reply code is returned, -1 when the descriptor closed. A "DDD-" line of a multi-line reply
 * is kept in `first` when given (the STATE line). */
HELPER int ctl(int fd, const char *line, char *reply, size_t n, char *first, size_t first_n) {
    char out[512];
    int len = snprintf(out, sizeof out, "%s\n", line);
    DIE_UNLESS(write(fd, out, (size_t)len) == len);
    if (first && first_n) first[0] = 0;
    for (;;) {
        size_t i = 0;
        char c;
        for (;;) {
            ssize_t r = read(fd, &c, 1);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return -1;
            if (c == '\n') break;
            if (i + 1 < n) reply[i++] = c;
        }
        reply[i] = 0;
        if (i >= 4 && reply[3] == '-') {
            if (first && first_n && !first[0]) snprintf(first, first_n, "%s", reply + 4);
            continue;
        }
        return atoi(reply);
    }
}

/* The number after " key=" in a STATE line, or -1. */
HELPER long long state_field(const char *line, const char *key) {
    char k[64];
    snprintf(k, sizeof k, " %s=", key);
    const char *p = strstr(line, k);
    return p ? atoll(p + strlen(k)) : -1;
}

HELPER void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

#endif
