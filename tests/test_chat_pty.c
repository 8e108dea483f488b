/* `quill chat` on a terminal: a pseudo-terminal drives the REPL as a person would (typing, Ctrl-C,
 * Ctrl-D, a bracketed paste, a """ block) and reads what it shows. */
#include "test.h"

#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd;
    pid_t pid;
    char out[1 << 16];
    size_t len;
} session;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Starts `quill chat ARGS...` on a new pseudo-terminal. */
static bool start(session *s, const char *const *args) {
    memset(s, 0, sizeof *s);
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)quill_bin();
    argv[n++] = "chat";
    for (; *args && n < 30; args++) argv[n++] = (char *)*args;
    argv[n] = NULL;
    s->pid = forkpty(&s->fd, NULL, NULL, NULL);
    if (s->pid < 0) return false;
    if (s->pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    return true;
}

/* Reads until `want` appears after offset `from` (or the time runs out); true when it did. */
static bool wait_for(session *s, size_t from, const char *want, double seconds) {
    double end = now_s() + seconds;
    for (;;) {
        s->out[s->len] = 0;
        if (strstr(s->out + from, want)) return true;
        double left = end - now_s();
        if (left <= 0) return false;
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        ssize_t got = read(s->fd, s->out + s->len, sizeof s->out - 1 - s->len);
        if (got <= 0) {
            s->out[s->len] = 0;
            return strstr(s->out + from, want) != NULL;
        }
        s->len += (size_t)got;
        if (s->len >= sizeof s->out - 1) s->len = 0; /* keep going; old output is not needed */
    }
}

/* wait_for, then moves *mark past the match: the next wait looks only at what follows it. */
static bool wait_after(session *s, size_t *mark, const char *want, double seconds) {
    if (!wait_for(s, *mark, want, seconds)) return false;
    *mark = (size_t)(strstr(s->out + *mark, want) - s->out) + strlen(want);
    return true;
}

static void type(session *s, const char *keys) {
    size_t n = strlen(keys);
    while (n) {
        ssize_t w = write(s->fd, keys, n);
        if (w <= 0 && errno != EINTR) return;
        if (w > 0) keys += w, n -= (size_t)w;
    }
}

/* Waits for the process to end (killing it after `seconds`); returns its exit status or -1. */
static int finish(session *s, double seconds) {
    double end = now_s() + seconds;
    int status;
    for (;;) {
        char drain[4096];
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, 20) > 0) {
            ssize_t got = read(s->fd, drain, sizeof drain);
            if (got > 0 && s->len + (size_t)got < sizeof s->out - 1) {
                memcpy(s->out + s->len, drain, (size_t)got);
                s->len += (size_t)got;
                s->out[s->len] = 0;
            }
        }
        pid_t r = waitpid(s->pid, &status, WNOHANG);
        if (r == s->pid) break;
        if (now_s() > end) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &status, 0);
            close(s->fd);
            return -1;
        }
    }
    close(s->fd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Ctrl-C while the reply streams stops it and the chat goes on; Ctrl-C at the prompt clears a
 * half-typed line; Ctrl-D leaves with a newline. */
TEST(chat_pty_ctrl_c_stops_reply_and_clears_line) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/synth-32k-q4_k_m.gguf");
    const char *args[] = {"-m", model, "-n", "-1", "-c", "2048", "--temp", "0", NULL};
    session s;
    CHECK(start(&s, args), "forkpty failed");
    size_t mark = 0;
    bool ok = wait_after(&s, &mark, ">>> ", 60);
    type(&s, "Tell me a long story\r");
    /* the echo, then some reply text, then Ctrl-C */
    ok = ok && wait_after(&s, &mark, "Tell me a long story\r\n", 60) &&
         wait_after(&s, &mark, "ibles bzwko", 60); /* the reply's first words (greedy, same bits on every
                                                       kernel set): any byte could precede the reply */
    type(&s, "\003");
    ok = ok && wait_after(&s, &mark, "[stopped]", 60) && wait_after(&s, &mark, ">>> ", 60);
    bool stopped = ok;
    /* a half-typed line, Ctrl-C: the line is gone, the next command runs alone */
    type(&s, "half typed");
    ok = ok && wait_after(&s, &mark, "half typed", 60);
    type(&s, "\003");
    ok = ok && wait_after(&s, &mark, "[Ctrl-C again or Ctrl-D to leave]", 60) && wait_after(&s, &mark, ">>> ", 60);
    bool cleared = ok;
    type(&s, "/help\r");
    ok = ok && wait_after(&s, &mark, "/bye", 60) && wait_after(&s, &mark, "\n>>> ", 60);
    bool help = ok;
    type(&s, "\004");
    int rc = finish(&s, 60);
    free(model);
    CHECK(stopped, "Ctrl-C did not stop the reply: %s", s.out);
    CHECK(cleared, "Ctrl-C at the prompt: %s", s.out);
    CHECK(help, "/help after Ctrl-C: %s", s.out);
    CHECK(!strstr(s.out, "half typed/help"), "the half-typed line was kept: %s", s.out);
    CHECK(rc == 0, "exit %d: %s", rc, s.out);
    CHECK(strstr(s.out, "\r\n\033[?2004l") != NULL, "no newline before leaving: %s", s.out);
}

/* A bracketed paste of several lines is one message, """ opens a multi-line message, an empty line
 * sends nothing, and Ctrl-C twice leaves. */
TEST(chat_pty_paste_multiline_and_double_ctrl_c) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    const char *args[] = {"-m", model, "-n", "3", "--temp", "0", "--verbose", NULL};
    session s;
    CHECK(start(&s, args), "forkpty failed");
    bool ok = wait_for(&s, 0, ">>> ", 60);
    size_t mark = s.len;
    type(&s, "\r\r");
    type(&s, "\033[200~Once upon\ra time\033[201~\r");
    ok = ok && wait_after(&s, &mark, "[turn 1: evaluating", 60) && wait_after(&s, &mark, "tokens in context]", 60) &&
         wait_after(&s, &mark, ">>> ", 60);
    bool pasted = ok && !strstr(s.out + mark, "[turn 2:");
    type(&s, "\"\"\"There was\r");
    ok = ok && wait_after(&s, &mark, "... ", 60);
    type(&s, "a dog\r");
    ok = ok && wait_after(&s, &mark, "... ", 60);
    type(&s, "named Max\"\"\"\r");
    ok = ok && wait_after(&s, &mark, "[turn 2: evaluating", 60) && wait_after(&s, &mark, "tokens in context]", 60) &&
         wait_after(&s, &mark, ">>> ", 60);
    bool multi = ok && !strstr(s.out + mark, "[turn 3:");
    type(&s, "\003");
    ok = ok && wait_after(&s, &mark, "[Ctrl-C again", 60) && wait_after(&s, &mark, ">>> ", 60);
    type(&s, "\003");
    int rc = finish(&s, 60);
    free(model);
    CHECK(pasted, "the paste was not one message: %s", s.out);
    CHECK(multi, "the \"\"\" block was not one message: %s", s.out);
    CHECK(rc == 0, "Ctrl-C twice: exit %d: %s", rc, s.out);
}
