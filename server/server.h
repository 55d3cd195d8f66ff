/* server/: the potserve binary's commands. `serve` runs the HTTP server;
 * the others drive the engine from the command line. Each takes the
 * subcommand's argv (argv[0] is the command name) and returns the exit code. */
#ifndef POTSERVE_SERVER_H
#define POTSERVE_SERVER_H

int cli_generate(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_recall(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_logits(int argc, char **argv);
int cli_ingest(int argc, char **argv);
/* The HTTP server (server/serve.c); returns when it has drained. */
int cli_serve(int argc, char **argv);

#endif
