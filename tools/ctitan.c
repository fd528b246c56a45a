/* `ctitan`: the single user-facing command; dispatches to tools/cmd_<name>.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cmds.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {"prep", cmd_prep, "train a byte-level BPE tokenizer and write token shards"},
    {"launch", cmd_launch, "run a training job from a manifest: loader, pipeline stages, optimizer shards"},
    {"plan", cmd_plan, "print a job's memory plan per process and device, and whether it fits (launch --dry-run)"},
    {"loader", cmd_loader, "loader swap --job NAME --cmd CMD: replace a running job's loader"},
    {"status", cmd_status, "status --job NAME: which step a running job is at, its restarts"},
    {"train", cmd_train, "train in one process on token shards (the single-process reference)"},
    {"bench", cmd_bench, "measure the kernels and the training step"},
    {"generate", cmd_generate, "continue a prompt with a checkpoint's model (KV cache, CPU): sampling, streaming"},
    {"ckpt", cmd_ckpt, "checkpoints: ls DIR, verify PATH, export PATH --safetensors OUT, keygen PREFIX"},
};

/* Debian's OpenBLAS 0.3.21 does not recognise recent AVX-512 CPUs and falls back to AVX2
 * kernels at half the speed; it reads OPENBLAS_CORETYPE only when it loads, before main,
 * so set it and re-execute once. An explicit OPENBLAS_CORETYPE from the user wins. */
static void pick_openblas_kernels(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE") || !__builtin_cpu_supports("avx512f"))
        return;
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the default kernels */
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ctitan COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\n`ctitan COMMAND --help` describes each.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (!strcmp(argv[1], cmds[i].name)) {
            pick_openblas_kernels(argv);
            return cmds[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "ctitan: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
