/* The HTTP side: libmicrohttpd with a thread per connection (a handler may wait for the engine),
 * request bodies with their limits, the route table and authentication. The top of the server:
 * it calls the routes (routes_*.c), which answer through reply.c and never call back here. A new
 * route: a handler in routes_*.c and a line in `routes` below. */
#include "server.h"
#include "base/error.h"

#include <microhttpd.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef struct {
    const char *method, *path;
    route_fn fn;
    bool auth;      /* needs the API key when the server has one */
} route;

static const route routes[] = {
    {"POST", "/v1/chat/completions", route_chat_completions, true},
    {"POST", "/v1/completions", route_completions, true},
    {"GET", "/v1/models", route_models, true},
    {"POST", "/v1/messages", route_messages, true},
    {"POST", "/v1/responses", route_responses, true},
    {"POST", "/v1/embeddings", route_embeddings, true},
    {"POST", "/tokenize", route_tokenize, true},
    {"POST", "/detokenize", route_detokenize, true},
    /* open, for load balancers and monitoring */
    {"GET", "/health", route_health, false},
    {"GET", "/metrics", route_metrics, false},
};

/* Per connection and request: the body as it arrives. */
typedef struct {
    char *body;
    size_t len, cap;
    bool too_big, timed_out;
    double started;     /* when the header was in */
} body_state;

/* Compares the whole presented key whatever its content, so that the time taken tells nothing
 * about how much of it was right. */
static bool key_matches(const char *given, const char *key) {
    size_t gl = strlen(given), kl = strlen(key);
    unsigned char diff = gl != kl;
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < gl ? given[i] : 0);
    return diff == 0;
}

static bool authorized(http_request *r) {
    const char *key = r->srv->api_key;
    if (!key) return true;
    /* Anthropic's clients send the key as x-api-key */
    const char *x = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "x-api-key");
    if (x) return key_matches(x, key);
    const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    return key_matches(h + 7, key);
}

static int dispatch(http_request *r) {
    server *s = r->srv;
    if (!strcmp(r->method, "OPTIONS") && s->cfg.cors_origin) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, x-api-key, anthropic-version");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "86400");
        return reply_queue(r, 204, resp);
    }
    const route *found = NULL;
    bool path_known = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(r->url, routes[i].path) != 0) continue;
        path_known = true;
        if (!strcmp(r->method, routes[i].method) || (!strcmp(r->method, "HEAD") && !strcmp(routes[i].method, "GET")))
            found = &routes[i];
    }
    api_error e;
    if (!found) {
        if (path_known) {
            api_fail(&e, 405, NULL, "%s is not allowed on %s", r->method, r->url);
            return reply_error(r, &e);
        }
        api_fail(&e, 404, NULL, "no route %s %s (see /v1/models, /v1/chat/completions, /v1/completions, /health)",
                 r->method, r->url);
        return reply_error(r, &e);
    }
    if (found->auth && !authorized(r)) {
        api_fail(&e, 401, NULL, "invalid or missing API key: send the header 'Authorization: Bearer KEY' (or 'x-api-key: KEY')");
        return reply_error(r, &e);
    }
    if (found->fn != route_health && !atomic_load(&s->ready)) {
        api_fail(&e, 503, NULL, "the model is loading");
        return reply_error(r, &e);
    }
    return found->fn(r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size,
                                  void **con_cls) {
    (void)version;
    server *s = cls;
    body_state *b = *con_cls;
    http_request r = {s, conn, method, url, NULL, 0};
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return MHD_NO;
        *con_cls = b;
        b->started = now_ms();
        /* a body announced too big is refused before it is read */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) b->too_big = true;
        if (!b->too_big) return MHD_YES;
    }
    if (b->timed_out) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size && now_ms() - b->started > s->cfg.read_timeout_s * 1e3) {
        /* a body trickled in slowly holds a connection: it must arrive within the read timeout */
        api_error e;
        api_fail(&e, 408, NULL, "the request body took longer than %d s to arrive (--read-timeout)", s->cfg.read_timeout_s);
        b->timed_out = true;
        free(b->body);
        b->body = NULL;
        b->len = b->cap = 0;
        *upload_size = 0;
        return (enum MHD_Result)reply_error(&r, &e);
    }
    if (*upload_size) {
        if (!b->too_big && b->len + *upload_size > s->cfg.max_body) {
            b->too_big = true;
            free(b->body);
            b->body = NULL;
            b->len = b->cap = 0;
        }
        if (!b->too_big) {
            if (b->len + *upload_size + 1 > b->cap) {
                size_t cap = (b->len + *upload_size + 1) * 2;
                if (cap > s->cfg.max_body + 1) cap = s->cfg.max_body + 1;
                char *grown = realloc(b->body, cap);
                if (!grown) return MHD_NO;
                b->body = grown;
                b->cap = cap;
            }
            memcpy(b->body + b->len, upload_data, *upload_size);
            b->len += *upload_size;
            b->body[b->len] = 0;
        }
        *upload_size = 0;
        /* the refusal is queued at once; libmicrohttpd discards the rest of the upload */
        if (!b->too_big) return MHD_YES;
    }
    if (b->too_big) {
        api_error e;
        api_fail(&e, 413, NULL, "the request body is larger than this server's limit of %zu bytes", s->cfg.max_body);
        return (enum MHD_Result)reply_error(&r, &e);
    }
    r.body = b->body ? b->body : "";
    r.body_len = b->len;
    /* The request is in: the reply may take as long as generation needs. */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->cfg.timeout_s);
    return (enum MHD_Result)dispatch(&r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    /* the next request on a kept-alive connection must arrive within the read timeout again */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->cfg.read_timeout_s);
    body_state *b = *con_cls;
    if (b) {
        free(b->body);
        free(b);
        *con_cls = NULL;
    }
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fputs("quill serve: ", stderr);
    vfprintf(stderr, fmt, ap);
}

struct MHD_Daemon *http_start(server *s, quill_error *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (rc) {
        quill_fail(err, QUILL_E_ARG, "--host %s: %s", s->cfg.host, gai_strerror(rc));
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_SOCK_ADDR,
        ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->cfg.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_per_client,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.read_timeout_s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) quill_fail(err, QUILL_E_IO, "cannot listen on %s:%d (address in use, or not an address of this machine?)",
                       s->cfg.host, s->cfg.port);
    return d;
}

int http_port(struct MHD_Daemon *d) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : -1;
}
