/* The quill command-line tool: one file per subcommand, each a thin client of libquill. */
#ifndef QUILL_CLI_H
#define QUILL_CLI_H

#include "quill.h"

#include <stdbool.h>
#include <stdio.h>

int cmd_inspect(int argc, char **argv);
int cmd_tensor(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_serve(int argc, char **argv);   /* server/serve.c */
int cmd_devices(int argc, char **argv);

/* Prints "quill: <message>" to stderr and returns the exit code 1. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes s as a JSON string literal (quotes included); bytes that are not UTF-8 become U+FFFD. */
void cli_json_string(FILE *f, const char *s, size_t len);
/* A whole file, NUL-terminated and malloc'd; NULL with errno set on failure (files over 1 GiB
 * are refused). */
char *cli_read_file(const char *path, size_t *len);
/* The rest of a stream (stdin), NUL-terminated; NULL on a read error or out of memory. */
char *cli_read_stream(FILE *f, size_t *len);
/* Appends s[0..n) to a growing NUL-terminated text (*text may start NULL); false when memory ran
 * out, the text as it was. */
bool cli_text_append(char **text, size_t *len, size_t *cap, const char *s, size_t n);
/* Parses a whole decimal number into *out within [lo, hi]; false on junk or out of range. */
bool cli_parse_long(const char *s, long lo, long hi, long *out);
bool cli_parse_double(const char *s, double lo, double hi, double *out);
/* -ctk/--cache-type-k and -ctv/--cache-type-v: the KV cache type `value` names; false after
 * printing "<command>: <flag>: ..." with the allowed names. */
bool cli_parse_cache_type(const char *command, const char *flag, const char *value, quill_type *out);
/* --backend: cpu or vulkan; false after printing "<command>: --backend ...: the backends are ...". */
bool cli_parse_backend(const char *command, const char *value, quill_backend *out);

#endif
