/* potserve entry point: dispatches the subcommands. Each subcommand parses its
 * own flags and prints its own --help. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "server/server.h"

#ifndef POTSERVE_REVISION
#define POTSERVE_REVISION "unknown" /* the Makefile passes git's revision */
#endif

static const char usage[] =
    "usage: potserve COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  serve      run the HTTP server (OpenAI-compatible endpoints, sessions with memory pots)\n"
    "  generate   generate text from a prompt (streams to stdout)\n"
    "  tokenize   print the token ids of stdin on one line\n"
    "  recall     print what a session's recall would put before a question (passages of stdin)\n"
    "  info       describe a GGUF model\n"
    "  logits     print the last-position logits of a prompt (for reference checks)\n"
    "  ingest     read a document of any length through a memory pot and answer a question\n"
    "\n"
    "Run 'potserve COMMAND --help' for the options of a command, 'potserve --version' for the build.\n";

/* A command's exit status, or 1 when what it printed did not all reach
 * stdout (a full disk, a closed descriptor): output lost is a failure. */
static int with_output_checked(const char *cmd, int rc) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    fprintf(stderr, "potserve %s: writing the output failed: %s\n", cmd, strerror(errno ? errno : EIO));
    return rc ? rc : 1;
}

static int run(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("potserve %s\n", POTSERVE_REVISION);
        return 0;
    }
    if (!strcmp(cmd, "serve")) return cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "recall")) return cli_recall(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cli_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "logits")) return cli_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "ingest")) return cli_ingest(argc - 1, argv + 1);
    fprintf(stderr, "potserve: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}

int main(int argc, char **argv) { return with_output_checked(argc > 1 ? argv[1] : "", run(argc, argv)); }
