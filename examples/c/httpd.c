/* httpd.c: a small, honest HTTP/1.0 file server — and the same server with penstock.
 *
 *   cc -O2 -o httpd examples/c/httpd.c
 *   cc -O2 -DUSE_READWRITE -o httpd-rw examples/c/httpd.c
 *   cc -O2 -DUSE_PENSTOCK -o httpd-penstock examples/c/httpd.c $(pkg-config --cflags --libs penstock)
 *   cc -O2 -DUSE_PENSTOCK -DUSE_PENSTOCK_CONNECT -o httpd-handoff examples/c/httpd.c $(pkg-config --cflags --libs penstock)
 *   ./httpd [-p PORT] [-n REQUESTS] DOCROOT      (PORT 0: any free port; prints it)
 *
 * One thread, one connection at a time: accept, read the request head, answer GET for a
 * regular file beneath DOCROOT (no "..", no directories) with a 200 head and the file's
 * bytes, 400/404/501 otherwise, close. The plain build sends the body with a sendfile(2) loop,
 * so the server is busy until the client has it all.
 *
 * The penstock build changes two lines of the server (marked "penstock, line 1" and "line 2"):
 * it opens an engine at start, and hands the file and the client socket to penstock instead
 * of running the sendfile loop — the server is free for the next connection at once while
 * penstock moves the bytes (Cues' "two lines", issue 14). Counted honestly, the build also
 * adds the block right below: the header, the engine's variable, the helper that does
 * penstock_cue() + START, and a drain-and-free at exit. The environment variable
 * HTTPD_PENSTOCK_OPTIONS, when set, is appended to the cue's options (OPEN's options, e.g.
 * "schedule=16,1ms unit=65536": `penstock bench cues` sweeps (k, t) with it).
 *
 * The read/write build (-DUSE_READWRITE) sends the body the way most servers did before
 * sendfile: a read(2)/write(2) loop through a 64 KiB buffer in user space — the baseline of
 * Cues' experiments (`penstock bench cues`). All three builds serve the same bytes
 * (crates/libpenstock/tests/c.rs checks it with curl).
 *
 * The hand-off build (-DUSE_PENSTOCK -DUSE_PENSTOCK_CONNECT) changes the same two lines the
 * other way: line 1 connects once to a running `penstock serve`'s Unix control socket (the
 * path in the environment variable PENSTOCK_SOCKET) with penstock_connect(), and line 2's
 * helper calls penstock_conn_cue() — the same shape as penstock_cue(), a control descriptor
 * back — so the bodies are sent by the server process, with its admission, classes and
 * metrics (issue 14 item 2).
 *
 * -DUSE_SENDFILE_NONBLOCKING (a measurement baseline, not a server anyone should prefer):
 * the plain build's sendfile(2) on a non-blocking socket, 4 MiB a call, waiting in poll(2)
 * for POLLOUT whenever the socket's buffer is full — the pattern of an event-loop server and
 * of penstock's engine, without penstock. On loopback the kernel charges part of the
 * receiver's TCP processing to whichever side runs it; this build shows how much of the
 * sender's CPU per GB is that pattern's and not penstock's (`penstock bench cues`).
 *
 * -n REQUESTS: serve that many connections, then exit (0, the default: until SIGINT/SIGTERM).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef USE_PENSTOCK /* what the penstock build adds */
#include <penstock.h>

#ifndef USE_PENSTOCK_CONNECT
static penstock_engine *engine; /* opened by "penstock, line 1" */
#else
static penstock_conn *conn; /* the hand-off build: connected by "penstock, line 1" */
#endif

/* Hands `file` and `client` to penstock: a detached stream (it outlives its control
 * descriptor) started at once. penstock duplicates both descriptors, so the caller closes its
 * own right after; penstock closes its copies when the body is sent. 0, or -1 (with the
 * reason on stderr: then the caller sends the body itself). */
static int penstock_send(int file, int client) {
    char src[32], dst[32], reply[256];
    snprintf(src, sizeof src, "fd:%d", file);
    snprintf(dst, sizeof dst, "fd:%d", client);
    char options[512] = "DETACHED";
    const char *extra = getenv("HTTPD_PENSTOCK_OPTIONS");
    if (extra && *extra) snprintf(options, sizeof options, "DETACHED %s", extra);
#ifndef USE_PENSTOCK_CONNECT
    int ctl = penstock_cue(engine, src, dst, options);
#else
    int ctl = penstock_conn_cue(conn, src, dst, options);
#endif
    if (ctl < 0) {
        fprintf(stderr, "penstock cue: %s\n", penstock_last_error());
        return -1;
    }
    ssize_t n = -1;
    if (write(ctl, "START\n", 6) == 6) n = read(ctl, reply, sizeof reply - 1);
    close(ctl);
    if (n < 4 || strncmp(reply, "200 ", 4) != 0) {
        fprintf(stderr, "START: %.*s\n", n > 0 ? (int)n : 0, reply);
        return -1;
    }
    return 0;
}

/* At exit: the bodies still going are let finish (a minute at most), then the engine goes. */
__attribute__((destructor)) static void penstock_stop(void) {
#ifndef USE_PENSTOCK_CONNECT
    if (engine) {
        penstock_engine_drain(engine, 60000);
        penstock_engine_free(engine);
    }
#else
    penstock_conn_free(conn); /* detached streams go on in the server */
#endif
}
#endif

#define HEAD_BYTES_MAX 8192

static volatile sig_atomic_t stopping = 0;

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static void write_all(int fd, const char *b, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* the client left: nothing to do about it */
        b += w;
        n -= (size_t)w;
    }
}

static void status(int client, const char *line) {
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.0 %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s\n",
                     line, strlen(line) + 1, line);
    write_all(client, head, (size_t)n);
}

#if !defined(USE_READWRITE) && !defined(USE_SENDFILE_NONBLOCKING)
/* The plain build's body: sendfile(2) until the whole file is out (or the client left). */
static void send_file(int client, int file, off_t size) {
    off_t off = 0;
    while (off < size) {
        ssize_t n = sendfile(client, file, &off, (size_t)(size - off));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
    }
}
#elif defined(USE_SENDFILE_NONBLOCKING)
#include <poll.h>
#define SENDFILE_CALL_BYTES_MAX (4 << 20)
/* The baseline's body: sendfile(2) to the non-blocking socket, poll(2) for POLLOUT when its
 * buffer is full (a short count or EAGAIN), a minute at most per wait. */
static void send_file(int client, int file, off_t size) {
    off_t off = 0;
    fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK);
    while (off < size) {
        size_t want = (size_t)(size - off);
        if (want > SENDFILE_CALL_BYTES_MAX) want = SENDFILE_CALL_BYTES_MAX;
        ssize_t n = sendfile(client, file, &off, want);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (n < 0 && errno != EAGAIN)) break;
        if (n < 0 || (size_t)n < want) {
            struct pollfd p = {.fd = client, .events = POLLOUT};
            if (poll(&p, 1, 60000) != 1) break; /* a client that reads nothing for a minute */
        }
    }
}
#else
#define COPY_BUFFER_BYTES 65536
/* The read/write build's body: read(2) a buffer from the file, write(2) it to the client,
 * until the file ends (or the client left) — every byte copied into user space and out. */
static void send_file(int client, int file, off_t size) {
    static char buf[COPY_BUFFER_BYTES];
    off_t off = 0;
    while (off < size) {
        ssize_t n = read(file, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        for (ssize_t done = 0; done < n;) {
            ssize_t w = write(client, buf + done, (size_t)(n - done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return; /* the client left */
            done += w;
        }
        off += n;
    }
}
#endif

/* Reads the request head; 0 when a whole head (ending in an empty line) arrived. */
static int read_head(int client, char *buf, size_t cap) {
    size_t len = 0;
    while (len + 1 < cap) {
        ssize_t n = read(client, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        len += (size_t)n;
        buf[len] = 0;
        if (strstr(buf, "\r\n\r\n") || strstr(buf, "\n\n")) return 0;
    }
    return -1;
}

/* A request path as a file name beneath the root: "/a/b.txt" -> "a/b.txt"; NULL when it
 * climbs out ("..") or is empty. */
static const char *file_name(char *path) {
    if (path[0] != '/') return NULL;
    char *q = strpbrk(path, "?#");
    if (q) *q = 0;
    for (char *p = path; (p = strstr(p, "..")) != NULL; p += 2)
        if ((p == path || p[-1] == '/') && (p[2] == 0 || p[2] == '/')) return NULL;
    while (*path == '/') path++;
    return *path ? path : NULL;
}

static void serve(int root, int client) {
    char req[HEAD_BYTES_MAX];
    if (read_head(client, req, sizeof req) != 0) {
        status(client, "400 Bad Request");
        return;
    }
    char method[16], path[4096], version[16];
    if (sscanf(req, "%15s %4095s %15s", method, path, version) != 3 ||
        strncmp(version, "HTTP/1.", 7) != 0) {
        status(client, "400 Bad Request");
        return;
    }
    if (strcmp(method, "GET") != 0) {
        status(client, "501 Not Implemented");
        return;
    }
    const char *name = file_name(path);
    int file = name ? openat(root, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
    struct stat st;
    if (file < 0 || fstat(file, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (file >= 0) close(file);
        status(client, "404 Not Found");
        return;
    }
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     "Content-Length: %lld\r\nConnection: close\r\n\r\n",
                     (long long)st.st_size);
    write_all(client, head, (size_t)n);
#ifndef USE_PENSTOCK
    send_file(client, file, st.st_size);
#else
    if (penstock_send(file, client) != 0) send_file(client, file, st.st_size); /* penstock, line 2 */
#endif
    close(file);
}

int main(int argc, char **argv) {
    int port = 8080, opt;
    long requests = 0;
    while ((opt = getopt(argc, argv, "p:n:")) != -1) {
        if (opt == 'p') port = atoi(optarg);
        else if (opt == 'n') requests = atol(optarg);
        else {
            fprintf(stderr, "usage: %s [-p PORT] [-n REQUESTS] DOCROOT\n", argv[0]);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: %s [-p PORT] [-n REQUESTS] DOCROOT\n", argv[0]);
        return 2;
    }
    int root = open(argv[optind], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        perror(argv[optind]);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: accept() returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
#if defined(USE_PENSTOCK) && !defined(USE_PENSTOCK_CONNECT)
    engine = penstock_engine_new(NULL); /* penstock, line 1 (NULL: penstock_send says why) */
#elif defined(USE_PENSTOCK)
    penstock_connect(getenv("PENSTOCK_SOCKET"), &conn); /* penstock, line 1 (hand-off) */
#endif
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 128) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &alen) != 0) {
        perror("listen");
        return 1;
    }
    printf("listening on 127.0.0.1:%d\n", ntohs(a.sin_port));
    fflush(stdout);
    for (long served = 0; !stopping && (requests == 0 || served < requests); served++) {
        int client = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) {
            if (errno == EINTR) break;
            perror("accept");
            continue;
        }
        serve(root, client);
        close(client);
    }
    close(l);
    close(root);
    return 0;
}
