/* How a reply reaches the client: status counts, the common headers (CORS), JSON and text bodies,
 * error objects in the OpenAI or the Anthropic shape, streams, and whether the client is still
 * there. The floor the routes, the SSE writer and the generation jobs stand on: it calls none of
 * them, nor the router (http.c). */
#include "server.h"
#include "base/error.h"

#include <microhttpd.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

void server_count_status(server *s, int status) {
    if (status < 100 || status > 599) return;
    pthread_mutex_lock(&s->stats_mu);
    s->by_status[status / 100][status % 100]++;
    pthread_mutex_unlock(&s->stats_mu);
}

static void add_common_headers(http_request *r, struct MHD_Response *resp) {
    if (r->srv->cfg.cors_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->srv->cfg.cors_origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
}

int reply_queue(http_request *r, int status, struct MHD_Response *resp) {
    if (!resp) return MHD_NO;
    add_common_headers(r, resp);
    if (status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    int ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    server_count_status(r->srv, status);
    return ret;
}

int reply_text(http_request *r, int status, const char *content_type, const char *text) {
    size_t n = strlen(text);
    char *copy = malloc(n + 1);
    if (!copy) return MHD_NO;
    memcpy(copy, text, n + 1);
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, copy, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(copy);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", content_type);
    return reply_queue(r, status, resp);
}

int reply_json(http_request *r, int status, cJSON *json) {
    char *text = json ? cJSON_PrintUnformatted(json) : NULL;
    cJSON_Delete(json);
    if (!text) {
        api_error e;
        api_fail(&e, 500, NULL, "out of memory");
        return status == 500 ? MHD_NO : reply_error(r, &e);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json; charset=utf-8");
    return reply_queue(r, status, resp);
}

/* Anthropic's names for the error kinds. */
static const char *anthropic_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

int reply_error(http_request *r, const api_error *e) {
    if (r->url && !strncmp(r->url, "/v1/messages", 12)) {
        /* Anthropic's shape: {"type": "error", "error": {"type", "message"}} */
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "type", "error");
        cJSON *err = cJSON_AddObjectToObject(root, "error");
        cJSON_AddStringToObject(err, "type", anthropic_error_type(e->status));
        cJSON_AddStringToObject(err, "message", e->message);
        return reply_json(r, e->status, root);
    }
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "server_error");
    if (e->param) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    cJSON_AddNumberToObject(err, "code", e->status);
    return reply_json(r, e->status, root);
}

int reply_stream(http_request *r, struct MHD_Response *resp) {
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    /* nginx and other proxies pass the events on as they come */
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    return reply_queue(r, 200, resp);
}

bool http_client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}
