/* `ctitan launch MANIFEST [--section.key value ...]`: resolves the manifest with its
 * overrides and runs the job: host 0's coordinator under the supervisor that restarts a failed
 * job (stages/supervise/supervise.h), on one host or many; another host's agent (stages/coord/coord.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cmds.h"
#include "stages/coord/coord.h"
#include "stages/job/manifest.h"
#include "ipc/shm.h"
#include "stages/plan/plan.h"
#include "checkpointd/hf_import.h"
#include "stages/supervise/mps.h"
#include "stages/supervise/supervise.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctitan launch [--dry-run] MANIFEST.toml [--section.key value ...]\n"
            "       ctitan plan MANIFEST.toml [--section.key value ...]   (the same as --dry-run)\n"
            "Starts and supervises the job's processes (loader, pipeline stages, optimizer shards)\n"
            "and trains. Any manifest key can be overridden with its dotted name, e.g.\n"
            "  --training.steps 20 --parallelism.pipeline_parallel_degree 2 --metrics.file m.jsonl\n"
            "(--key=value works too). Sections and keys: see README.md.\n"
            "Across hosts: run it on every host with --job.hosts N --job.host_rank K (under srun with\n"
            "one task per node, SLURM_STEP_NUM_NODES and SLURM_NODEID give them) and the same\n"
            "--job.endpoint tcp://HOST0:PORT; host 0 coordinates.\n"
            "A failed job is relaunched from its newest checkpoint, at most --job.max_restarts\n"
            "times in a row from the same step (default 3; 0: never); across hosts the other\n"
            "hosts wait for it (--job.host_timeout_s, default 600).\n"
            "Before anything starts, the job's memory plan (per process and device: weights, gradients,\n"
            "optimizer state, activations, rings, workspaces) is checked against the host's memory and\n"
            "each GPU's; a job that cannot fit is refused, saying what it needs, what there is and what\n"
            "would make it fit. --dry-run (or `ctitan plan`) prints the plan and the check and starts\n"
            "nothing: status 0 when it fits, 1 when it does not.\n");
}

/* The memory plan of m against what this host has: printed with `print` (a dry run), else
 * only a refusal; *sharing the most of the job's processes on one GPU of this host. Returns 0
 * when it fits, 1 when not, 2 on an error. */
static int check_plan(const manifest_t *m, int print, int *sharing)
{
    plan_t p;
    plan_have_t have;
    char err[4096];
    if (plan_build(&p, m, &(plan_opts_t){0}, err, sizeof(err))) {
        fprintf(stderr, "launch: the memory plan: %s\n", err);
        return 2;
    }
    plan_capacity(&have, m, p.gpus);
    if (print) {
        plan_print(&p, stdout);
        if (have.host >= 0)
            printf("  host has %.2f GiB (%s)\n", have.host / PLAN_GIB, have.host_from);
        if (plan_gpus(&p, &have) < p.gpus)
            printf("  this host has %d GPU%s: the %d GPU processes share them (ordinal k on GPU k %% %d)\n",
                   have.gpus, have.gpus == 1 ? "" : "s", p.gpus, have.gpus);
        for (int g = 0; g < plan_gpus(&p, &have); g++)
            if (have.gpu[g] >= 0)
                printf("  gpu%d needs %.2f GiB, has %.2f GiB (%s)\n", g, plan_gpu_need(&p, &have, g) / PLAN_GIB,
                       have.gpu[g] / PLAN_GIB, have.gpu_from);
            else
                printf("  gpu%d needs %.2f GiB; its memory is unknown, not checked (set job.device_memory_gib)\n", g,
                       plan_gpu_need(&p, &have, g) / PLAN_GIB);
    } else if (p.gpus && have.gpu[0] < 0) {
        fprintf(stderr, "launch: the GPUs' free memory is unknown (no nvidia-smi answered): the memory plan checks "
                "the host only (job.device_memory_gib sets it)\n");
    }
    *sharing = plan_gpu_sharing(&p, &have);
    if (print && *sharing > 1) { /* what job.mps would do with them */
        int off = !strcmp(m->mps, "off"), have = mps_available();
        printf("  GPU processes: %d share a GPU, %s (job.mps = \"%s\"%s)\n", *sharing,
               !off && have ? "under MPS" : "time-sliced", m->mps,
               off || have ? "" : !strcmp(m->mps, "on") ? ": " MPS_CONTROL " is not on PATH, the launch would refuse"
                                                      : ": " MPS_CONTROL " is not on PATH");
    }
    int rc = plan_check(&p, &have, m, err, sizeof(err));
    if (rc)
        fprintf(print ? stdout : stderr, "%s%s\n", print ? "  refused: " : "launch: ", err);
    else if (print)
        printf("  fits: `ctitan launch` would start it\n");
    fflush(stdout);
    plan_free(&p);
    return rc ? 1 : 0;
}

/* `ctitan launch`, or with dry_run `ctitan plan` (argv without the --dry-run). */
static int launch(int argc, char **argv, int dry_run)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    static manifest_t m;
    char err[1024];
    if (manifest_load(&m, argv[1], err, sizeof(err))) {
        fprintf(stderr, "launch: %s\n", err);
        return 2;
    }
    /* under `srun --ntasks-per-node 1`: one launch per node, node 0 the coordinator (flags still win) */
    const char *nodes = getenv("SLURM_STEP_NUM_NODES"), *node = getenv("SLURM_NODEID");
    if (nodes && node && (manifest_override(&m, "job.hosts", nodes, err, sizeof(err)) ||
                          manifest_override(&m, "job.host_rank", node, err, sizeof(err)))) {
        fprintf(stderr, "launch: from SLURM_STEP_NUM_NODES / SLURM_NODEID: %s\n", err);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) || !strchr(a, '.')) {
            fprintf(stderr, "launch: expected --section.key value, got '%s' (try --help)\n", a);
            return 2;
        }
        char key[256];
        const char *eq = strchr(a, '='), *value;
        if (eq) {
            snprintf(key, sizeof(key), "%.*s", (int)(eq - a - 2), a + 2);
            value = eq + 1;
        } else {
            if (i + 1 >= argc) {
                fprintf(stderr, "launch: %s needs a value\n", a);
                return 2;
            }
            snprintf(key, sizeof(key), "%s", a + 2);
            value = argv[++i];
        }
        if (manifest_override(&m, key, value, err, sizeof(err))) {
            fprintf(stderr, "launch: %s\n", err);
            return 2;
        }
    }
    /* a run that may start from a Hugging Face Llama has its model's shape */
    if (m.ckpt_initial_hf && m.ckpt_initial_path[0] && hf_import_manifest(&m, m.ckpt_initial_path, err, sizeof(err))) {
        fprintf(stderr, "launch: checkpoint.initial_load_path: %s\n", err);
        return 2;
    }
    if (manifest_validate(&m, err, sizeof(err))) {
        fprintf(stderr, "launch: %s\n", err);
        return 2;
    }
    /* the memory plan, before any process or segment is made, once the memory of a run stopped
     * just before is free (a Ctrl-C returns before the kernel has freed it: shm.h) */
    shm_wait_freed(shm_say_freeing, NULL, (void *)"launch");
    int sharing = 0, rc = check_plan(&m, dry_run, &sharing);
    if (rc || dry_run)
        return rc;
    /* the host's GPU processes under NVIDIA's Multi-Process Service (job.mps), for every run */
    static mps_t mps;
    if (mps_start(&mps, &m, sharing, err, sizeof(err))) {
        fprintf(stderr, "launch: %s\n", err);
        return 1;
    }
    /* host 0 (the coordinator) under the supervisor, on one host or many; another host's agent
     * outlives a coordinator it loses and waits for the next (stages/coord/coord_agent.c) */
    rc = m.host_rank == 0 ? sup_run(&m) : coord_run(&m, NULL);
    mps_stop(&mps);
    return rc;
}

int cmd_launch(int argc, char **argv)
{
    int dry_run = 0, n = 0;
    char **args = malloc((size_t)(argc + 1) * sizeof(*args));
    if (!args) {
        fprintf(stderr, "launch: out of memory\n");
        return 1;
    }
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--dry-run") && i > 0 && (i == 1 || strncmp(argv[i - 1], "--", 2) || strchr(argv[i - 1], '=')))
            dry_run = 1;
        else
            args[n++] = argv[i];
    args[n] = NULL;
    int rc = launch(n, args, dry_run);
    free(args);
    return rc;
}

int cmd_plan(int argc, char **argv) { return launch(argc, argv, 1); }
