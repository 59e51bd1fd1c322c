/* Byte-exact transfers through libpenstock, in process, on loopback with the real kernel:
 * file -> TCP (a control descriptor; the socket given as fd:N and closed by the caller at
 * once), file -> TCP by name (typed calls), file -> UDP paced (a connected UDP socket as
 * fd:N; pace and lateness figures), TCP socket (fd:N) -> file, pipe -> Unix socket, and
 * Roadrunner's one-shot penstock_stream(), burst and periodic. */
#include "common.h"

#include <sys/un.h>

static penstock_engine *engine;

static void file_to_tcp_through_a_control_descriptor(void) {
    char path[64];
    const size_t n = (3u << 20) + 4097;
    make_file(path, n);
    int src = open(path, O_RDONLY | O_CLOEXEC);
    struct receiver r;
    int send_end = tcp_to_receiver(&r);

    char s[32], d[32], reply[256], line[512];
    snprintf(s, sizeof s, "fd:%d", src);
    snprintf(d, sizeof d, "fd:%d", send_end);
    int c = penstock_cue(engine, s, d, NULL);
    CHECK(c >= 0);
    /* The caller's own copies may go at once: penstock holds its duplicates. */
    close(src);
    close(send_end);
    if (c < 0) return;
    CHECK(ctl(c, "STATE", reply, sizeof reply, line, sizeof line) == 211);
    CHECK(strstr(line, " pending ") != NULL);
    CHECK(ctl(c, "START", reply, sizeof reply, NULL, 0) == 200);
    receiver_join(&r);
    CHECK(r.len == n && is_pattern(r.buf, n, 0));
    /* The receiver saw EOF: the stream is done, with every byte counted. */
    CHECK(ctl(c, "STATE", reply, sizeof reply, line, sizeof line) == 211);
    CHECK(strstr(line, " done ") != NULL);
    CHECK(state_field(line, "sent") == (long long)n);
    CHECK(ctl(c, "CLOSE", reply, sizeof reply, NULL, 0) == 200);
    CHECK(ctl(c, "QUIT", reply, sizeof reply, NULL, 0) == 221);
    close(c);
    free(r.buf);
    unlink(path);
}

static void file_to_tcp_by_name_with_typed_calls(void) {
    char path[64];
    const size_t n = 1000003;
    make_file(path, n);
    int port;
    int l = tcp_listener(&port);
    char d[64];
    snprintf(d, sizeof d, "tcp://127.0.0.1:%d", port);
    penstock_stream_t *st = NULL;
    CHECK(penstock_stream_open(engine, path, d, "unit=64KiB", &st) == PENSTOCK_OK);
    penstock_stream_state_t s;
    CHECK(penstock_stream_state(st, &s) == PENSTOCK_OK);
    CHECK(s.state == PENSTOCK_STATE_PENDING && s.sent == 0 && s.remaining == -1);
    CHECK(penstock_stream_start(st) == PENSTOCK_OK);
    int a = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    DIE_UNLESS(a >= 0);
    struct receiver r;
    receiver_start(&r, a);
    CHECK(penstock_stream_wait(st, -1) == PENSTOCK_OK);
    receiver_join(&r);
    CHECK(r.len == n && is_pattern(r.buf, n, 0));
    CHECK(penstock_stream_state(st, &s) == PENSTOCK_OK);
    CHECK(s.state == PENSTOCK_STATE_DONE && s.sent == n && s.offset == n);
    CHECK(s.rate_bytes_per_s == 0 && s.units_paced == 0);
    CHECK(penstock_stream_close(st) == PENSTOCK_OK);
    close(l);
    free(r.buf);
    unlink(path);
}

static void file_to_udp_paced(void) {
    char path[64];
    const size_t unit = 1316, units = 200, n = unit * units;
    make_file(path, n);
    int rx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    DIE_UNLESS(bind(rx, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t alen = sizeof a;
    DIE_UNLESS(getsockname(rx, (struct sockaddr *)&a, &alen) == 0);
    int big = 4 << 20;
    setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    struct timeval tv = {5, 0};
    setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    /* The target: a UDP socket of ours, connected to the receiver, as fd:N. */
    int tx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    DIE_UNLESS(connect(tx, (struct sockaddr *)&a, sizeof a) == 0);
    char d[32];
    snprintf(d, sizeof d, "fd:%d", tx);
    penstock_stream_t *st = NULL;
    /* 500 units a second: 200 units take 398 ms at least. */
    CHECK(penstock_stream_open(engine, path, d, "rate=500/s unit=1316", &st) == PENSTOCK_OK);
    close(tx);
    if (!st) return;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(penstock_stream_start(st) == PENSTOCK_OK);
    unsigned char *got = malloc(n + unit);
    size_t len = 0, datagrams = 0, wrong_size = 0;
    while (len < n) {
        ssize_t k = recv(rx, got + len, unit + 1, 0);
        if (k <= 0) break;
        if ((size_t)k != unit) wrong_size++;
        len += (size_t)k;
        datagrams++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(penstock_stream_wait(st, -1) == PENSTOCK_OK);
    CHECK(len == n && datagrams == units && wrong_size == 0);
    CHECK(is_pattern(got, len < n ? len : n, 0));
    /* Paced, not a burst: the first and the last unit are 199 periods apart. */
    double elapsed = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECK(elapsed >= 0.398 * 0.95);
    penstock_stream_state_t s;
    CHECK(penstock_stream_state(st, &s) == PENSTOCK_OK);
    CHECK(s.state == PENSTOCK_STATE_DONE && s.sent == n);
    CHECK(s.rate_bytes_per_s == 500 * unit);
    CHECK(s.units_paced == units);
    CHECK(s.lateness_p50_ns <= s.lateness_p99_ns && s.lateness_p99_ns <= s.lateness_max_ns);
    CHECK(penstock_stream_close(st) == PENSTOCK_OK);
    free(got);
    close(rx);
    unlink(path);
}

struct writer {
    pthread_t thread;
    int fd;
    size_t n;
};

static void *write_pattern(void *arg) {
    struct writer *w = arg;
    unsigned char *b = pattern(w->n);
    size_t off = 0;
    while (off < w->n) {
        ssize_t k = write(w->fd, b + off, w->n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (size_t)k;
    }
    free(b);
    close(w->fd);
    return NULL;
}

static void tcp_socket_to_file(void) {
    const size_t n = (2u << 20) + 11;
    int sender;
    int accepted = tcp_pair(&sender);
    char out[64];
    const char *tmp = getenv("TMPDIR");
    snprintf(out, sizeof out, "%s/penstock-c-out-%d", tmp ? tmp : "/tmp", (int)getpid());
    unlink(out);
    char s[32];
    snprintf(s, sizeof s, "fd:%d", accepted);
    penstock_stream_t *st = NULL;
    CHECK(penstock_stream_open(engine, s, out, NULL, &st) == PENSTOCK_OK);
    close(accepted);
    if (!st) return;
    CHECK(penstock_stream_start(st) == PENSTOCK_OK);
    struct writer w = {.fd = sender, .n = n};
    DIE_UNLESS(pthread_create(&w.thread, NULL, write_pattern, &w) == 0);
    CHECK(penstock_stream_wait(st, -1) == PENSTOCK_OK);
    pthread_join(w.thread, NULL);
    CHECK(penstock_stream_close(st) == PENSTOCK_OK);
    size_t len;
    unsigned char *got = read_file(out, &len);
    CHECK(len == n && is_pattern(got, len, 0));
    free(got);
    unlink(out);
}

static void pipe_to_unix_socket(void) {
    const size_t n = 300007;
    int p[2], u[2];
    DIE_UNLESS(pipe2(p, O_CLOEXEC) == 0);
    DIE_UNLESS(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, u) == 0);
    char s[32], d[32], reply[256];
    snprintf(s, sizeof s, "fd:%d", p[0]);
    snprintf(d, sizeof d, "fd:%d", u[0]);
    int c = penstock_cue(engine, s, d, "");
    CHECK(c >= 0);
    close(p[0]);
    close(u[0]);
    if (c < 0) return;
    struct receiver r;
    receiver_start(&r, u[1]);
    CHECK(ctl(c, "START", reply, sizeof reply, NULL, 0) == 200);
    struct writer w = {.fd = p[1], .n = n};
    DIE_UNLESS(pthread_create(&w.thread, NULL, write_pattern, &w) == 0);
    pthread_join(w.thread, NULL);
    receiver_join(&r);
    CHECK(r.len == n && is_pattern(r.buf, n, 0));
    close(c);
    free(r.buf);
}

static void one_shot_stream_burst_and_periodic(void) {
    char path[64];
    const size_t n = 777777;
    make_file(path, n);
    int src = open(path, O_RDONLY | O_CLOEXEC);
    struct receiver r;
    int send_end = tcp_to_receiver(&r);
    CHECK(penstock_stream(src, send_end, 0, 0, 0) == (int64_t)n);
    /* The caller's descriptors are still the caller's: closing the socket ends the peer. */
    close(send_end);
    receiver_join(&r);
    CHECK(r.len == n && is_pattern(r.buf, n, 0));
    free(r.buf);

    /* Periodic, with the copy path: 40 units of 1000 bytes, one every 2 ms. */
    send_end = tcp_to_receiver(&r);
    int p[2];
    DIE_UNLESS(pipe2(p, O_CLOEXEC) == 0);
    /* A pipe source holding exactly 40 units. */
    unsigned char *b = pattern(40000);
    DIE_UNLESS(write(p[1], b, 40000) == 40000);
    close(p[1]);
    free(b);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(penstock_stream(p[0], send_end, PENSTOCK_STREAM_COPY, 2000000, 1000) == 40000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double elapsed = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECK(elapsed >= 0.078 * 0.95);
    close(send_end);
    close(p[0]);
    receiver_join(&r);
    CHECK(r.len == 40000 && is_pattern(r.buf, 40000, 0));
    free(r.buf);
    close(src);
    unlink(path);
}

int main(void) {
    engine = penstock_engine_new(NULL);
    DIE_UNLESS(engine != NULL);
    file_to_tcp_through_a_control_descriptor();
    file_to_tcp_by_name_with_typed_calls();
    file_to_udp_paced();
    tcp_socket_to_file();
    pipe_to_unix_socket();
    one_shot_stream_burst_and_periodic();
    penstock_engine_free(engine);
    return finish("transfer");
}
