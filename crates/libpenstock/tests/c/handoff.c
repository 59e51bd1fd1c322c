/* Descriptor hand-off to a running server (started by tests/c.rs, a separate process):
 *   handoff SOCKET allowed         a file and a TCP socket handed over by penstock_conn_cue
 *                                  (CUE fd fd) arrive byte-exact at a receiver, driven through
 *                                  the control descriptor the server sends back; bad
 *                                  descriptors and options give codes and messages
 *   handoff SOCKET stranger        (run as a uid the socket does not allow) refused, 403
 *   handoff SOCKET token TOKEN     authenticated by the token only: refused all the same */
#include "common.h"

/* penstock_conn_cue of `file` to a new receiver: the control descriptor (or a code). */
static int cue_fds(penstock_conn *c, int file, int send_end, const char *options) {
    char src[32], dst[32];
    snprintf(src, sizeof src, "fd:%d", file);
    snprintf(dst, sizeof dst, "fd:%d", send_end);
    return penstock_conn_cue(c, src, dst, options);
}

static void allowed(penstock_conn *c) {
    char path[64], reply[512], line[512];
    const size_t n = 3u << 20;
    make_file(path, n);
    int file = open(path, O_RDONLY | O_CLOEXEC);
    DIE_UNLESS(file >= 0);
    struct receiver r;
    int send_end = tcp_to_receiver(&r);
    int ctl_fd = cue_fds(c, file, send_end, "class=bulk");
    CHECK(ctl_fd >= 0);
    /* The server holds its own duplicates. */
    close(file);
    close(send_end);
    /* The control descriptor speaks the protocol, the id left out, like penstock_cue()'s. */
    CHECK(ctl(ctl_fd, "START", reply, sizeof reply, NULL, 0) == 200);
    receiver_join(&r);
    CHECK(r.len == n && is_pattern(r.buf, r.len, 0));
    free(r.buf);
    CHECK(ctl(ctl_fd, "STATE", reply, sizeof reply, line, sizeof line) == 211);
    CHECK(strstr(line, " done ") != NULL && state_field(line, "sent") == (long long)n);
    /* It drives its own stream only. */
    CHECK(ctl(ctl_fd, "STATE 99999", reply, sizeof reply, NULL, 0) == 403);
    close(ctl_fd);

    /* A window set through the descriptor (SEEK + LENGTH), paced, PAUSE/RESUME on the way. */
    file = open(path, O_RDONLY | O_CLOEXEC);
    DIE_UNLESS(file >= 0);
    send_end = tcp_to_receiver(&r);
    ctl_fd = cue_fds(c, file, send_end, "rate=40/s unit=13160");
    CHECK(ctl_fd >= 0);
    close(file);
    close(send_end);
    CHECK(ctl(ctl_fd, "SEEK 4096", reply, sizeof reply, NULL, 0) == 200);
    CHECK(ctl(ctl_fd, "LENGTH 131600", reply, sizeof reply, NULL, 0) == 200);
    CHECK(ctl(ctl_fd, "START", reply, sizeof reply, NULL, 0) == 200);
    CHECK(ctl(ctl_fd, "PAUSE", reply, sizeof reply, NULL, 0) == 200);
    CHECK(ctl(ctl_fd, "STATE", reply, sizeof reply, line, sizeof line) == 211);
    CHECK(strstr(line, " paused ") != NULL);
    CHECK(ctl(ctl_fd, "RESUME", reply, sizeof reply, NULL, 0) == 200);
    receiver_join(&r);
    CHECK(r.len == 131600 && is_pattern(r.buf, r.len, 4096));
    free(r.buf);
    close(ctl_fd);

    /* Closing the descriptor of a stream not DETACHED closes the stream: the receiver sees
     * EOF long before the paced body (100 units at 1/s) could have arrived. */
    file = open(path, O_RDONLY | O_CLOEXEC);
    send_end = tcp_to_receiver(&r);
    ctl_fd = cue_fds(c, file, send_end, "rate=1/s unit=1316");
    CHECK(ctl_fd >= 0);
    close(file);
    close(send_end);
    CHECK(ctl(ctl_fd, "START", reply, sizeof reply, NULL, 0) == 200);
    close(ctl_fd);
    receiver_join(&r);
    CHECK(r.len < 10 * 1316);
    free(r.buf);

    /* Bad input: codes and messages, the connection still usable. */
    CHECK_ERR(penstock_conn_cue(c, "fd:999", "fd:1", NULL), PENSTOCK_EBADF,
              "not an open descriptor");
    CHECK_ERR(penstock_conn_cue(c, "fd:x", "fd:1", NULL), PENSTOCK_EINVAL, "source");
    CHECK_ERR(penstock_conn_cue(c, "a b", "fd:1", NULL), PENSTOCK_EINVAL, "white space");
    const char *tmp = getenv("TMPDIR");
    int dir = open(tmp ? tmp : "/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int sv[2];
    DIE_UNLESS(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    CHECK_ERR(cue_fds(c, dir, sv[0], NULL), PENSTOCK_EINVAL, "directory");
    file = open(path, O_RDONLY | O_CLOEXEC);
    CHECK_ERR(cue_fds(c, file, sv[0], "rate=fast"), PENSTOCK_EINVAL, "400");
    CHECK_ERR(cue_fds(c, file, sv[0], "DETACHED\nSTART 1"), PENSTOCK_EINVAL, "line break");
    CHECK_ERR(cue_fds(NULL, file, sv[0], NULL), PENSTOCK_ENULL, "NULL");
    CHECK_ERR(penstock_conn_cue(c, NULL, "fd:1", NULL), PENSTOCK_ENULL, "src");
    CHECK(penstock_conn_command(c, "START 99999", reply, sizeof reply) == 404);
    CHECK(penstock_conn_command(c, "HELP", reply, sizeof reply) == 214);
    CHECK(strstr(reply, "OPEN fd fd") != NULL); /* the first line of HELP */
    close(dir);
    close(file);
    close(sv[0]);
    close(sv[1]);
    unlink(path);
}

/* Whoever is not allowed by SO_PEERCRED gets 403 naming why, with descriptors or without. */
static void refused(penstock_conn *c) {
    int src = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int sv[2];
    DIE_UNLESS(src >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    CHECK_ERR(cue_fds(c, src, sv[0], NULL), PENSTOCK_EPERM, "SO_PEERCRED");
    CHECK(strstr(penstock_last_error(), "403") != NULL);
    /* Names instead of descriptors: 401 before AUTH, 403 after (no descriptor for a token). */
    CHECK_ERR(penstock_conn_cue(c, "/dev/null", "/dev/null", NULL), PENSTOCK_EPERM, "allowed");
    /* The connection goes on answering. */
    char reply[256];
    CHECK(penstock_conn_command(c, "HELP", reply, sizeof reply) == 214);
    close(src);
    close(sv[0]);
    close(sv[1]);
}

int main(int argc, char **argv) {
    DIE_UNLESS(argc >= 3);
    penstock_conn *c = NULL;
    CHECK_ERR(penstock_connect(NULL, &c), PENSTOCK_ENULL, "socket_path is NULL");
    CHECK_ERR(penstock_connect("/nonexistent/ctl.sock", &c), PENSTOCK_EIO, "/nonexistent");
    DIE_UNLESS(penstock_connect(argv[1], &c) == PENSTOCK_OK);
    CHECK(penstock_conn_set_timeout(c, 20000) == PENSTOCK_OK);
    CHECK_ERR(penstock_conn_set_timeout(c, 0), PENSTOCK_EINVAL, "timeout_ms");
    const char *mode = argv[2];
    if (strcmp(mode, "allowed") == 0) {
        allowed(c);
    } else if (strcmp(mode, "stranger") == 0) {
        refused(c);
    } else if (strcmp(mode, "token") == 0 && argc == 4) {
        char line[256], reply[256];
        snprintf(line, sizeof line, "AUTH %s", argv[3]);
        CHECK(penstock_conn_command(c, line, reply, sizeof reply) == 200);
        refused(c);
    } else {
        DIE_UNLESS(!"a known mode");
    }
    penstock_conn_free(c);
    CHECK_ERR(penstock_conn_command(c, "HELP", NULL, 0), PENSTOCK_EHANDLE, "not a live");
    return finish("handoff");
}
