/* Subcommands of the `ctitan` program, one tools/cmd_<name>.c each.
 * Each takes argv from the subcommand name on and returns the process exit status. */
#ifndef CTITAN_CMDS_H
#define CTITAN_CMDS_H

int cmd_prep(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_loader(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_ckpt_import(int argc, char **argv); /* `ctitan ckpt import`: tools/cmd_ckpt_import.c */

#endif
