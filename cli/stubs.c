/* TEMPORARY during development: weak fallbacks so the tool links while subcommands are written. */
#include "cli.h"
#define WEAK_CMD(n) __attribute__((weak)) int n(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("command not built yet"); }
WEAK_CMD(cmd_run)
WEAK_CMD(cmd_tokenize)
WEAK_CMD(cmd_compare)
WEAK_CMD(cmd_template)
WEAK_CMD(cmd_chat)
WEAK_CMD(cmd_bench)
WEAK_CMD(cmd_quantize)
WEAK_CMD(cmd_synth)
__attribute__((weak)) const char *quill_chat_builtin_template(const char *name) { (void)name; return NULL; }
__attribute__((weak)) const char *const *quill_chat_builtin_names(void) { static const char *n[] = {NULL}; return n; }
__attribute__((weak)) quill_status quill_chat_render(const char *t, const quill_chat_message *m, size_t n, const char *b, const char *e, bool a, char **out, quill_error *err) { (void)t; (void)m; (void)n; (void)b; (void)e; (void)a; *out = NULL; if (err) err->status = QUILL_E_TEMPLATE; return QUILL_E_TEMPLATE; }
