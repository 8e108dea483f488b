/* The inside of a generation (generation.c), for the routes that stream its choices themselves
 * (routes_openai.c); the others use server.h's gen_* functions. */
#ifndef QUILL_SERVER_GENERATION_H
#define QUILL_SERVER_GENERATION_H

#include "server.h"

typedef enum { PHASE_ROLE, PHASE_CONTENT, PHASE_USAGE, PHASE_DONE } stream_phase;

enum { MAX_CHOICES = 16 };

/* One of the `n` choices: its job, the reply's parse (chat) and what a stream sent of it. */
typedef struct choice {
    job *job;
    chat_tools *tools;
    size_t text_sent, tokens_sent;
    bool parsed_final, had_calls, finished;
} choice;

/* One generation request from parsing to the last byte sent. */
struct gen {
    sse_stream base;            /* first: a streamed reply's functions receive it */
    server *srv;
    struct MHD_Connection *conn;
    gen_request req;
    int n;                      /* choices */
    choice ch[MAX_CHOICES];
    char id[48];
    long long created;
    char *echo_text;            /* completions with echo: the prompt, which the text starts with */
    stream_phase phase;         /* of a streamed reply */
};

/* Cancels every choice's job (a no-op for finished ones). */
void gen_cancel(gen *g);

#endif
