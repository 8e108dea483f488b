/* Tests of quill serve: start the server on an ephemeral port of 127.0.0.1, talk HTTP/1.1 to it
 * with a small client of our own (status, headers, body with chunked encoding undone), stop it. */
#ifndef QUILL_TEST_SERVER_UTIL_H
#define QUILL_TEST_SERVER_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    int port;
    char log[512];      /* the server's stderr */
} test_server;

/* Starts `quill serve -m MODEL --port 0 ARGS` and waits (10 s at most) until it says "ready".
 * False, with a test failure naming the log, when it does not. */
bool server_start(test_server *s, const char *model, const char *args);
/* SIGTERM, then waits (20 s at most, SIGKILL after); the exit status, or -1 when it had to be
 * killed or died of a signal. */
int server_stop(test_server *s);

typedef struct {
    int status;
    char *headers;      /* the header block, NUL-terminated */
    char *body;         /* NUL-terminated (after dechunking) */
    size_t body_len;
} http_resp;

/* One request on its own connection; `headers` are extra lines each ending in "\r\n" (may be
 * NULL). False on a connection or protocol failure or after `timeout_s`. */
bool http_do(int port, const char *method, const char *path, const char *headers, const char *body, size_t body_len,
             int timeout_s, http_resp *out);
void http_resp_free(http_resp *r);
/* POST with a JSON body. */
bool http_post(int port, const char *path, const char *json, http_resp *out);
/* The value of a header (case-insensitive name), malloc'd, or NULL. */
char *http_header(const http_resp *r, const char *name);
/* Joins the "content" (chat) or "text" (completion) deltas of an SSE body; malloc'd. Sets
 * *finish to the finish_reason seen (malloc'd, or NULL) and *done when "data: [DONE]" ended it. */
char *sse_text(const char *body, char **finish, bool *done);

/* Connects and returns the socket, or -1. */
int http_connect(int port);

/* A recurrent model served with `args`: greedy completions of prompt[0..n_first), then of all n tokens
 * (which must reuse at least n_first cached tokens), then of the first n_first again (back through a
 * checkpoint); the second and third must answer as a fresh server does. Failures are recorded;
 * `label` names the model in them. */
void server_check_prefix_reuse(const char *label, const char *model, const char *args, const int32_t *prompt,
                               int n_first, int n);

#endif
