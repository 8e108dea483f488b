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
