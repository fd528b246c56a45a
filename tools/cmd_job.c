/* Commands that talk to a running job's coordinator, found through the job's shared segment
 * (it records the control endpoint, the coordinator's public key and its run folder). They
 * are heard only as the job's operator: with the key in the run folder that only the job's
 * owner can read (DESIGN.md "Trust").
 *   ctitan loader swap --job NAME --cmd "..."   replace the loader at the next step boundary
 *   ctitan status --job NAME                    where the job is, and its restarts so far */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/argv.h"
#include "ipc/ctl.h"
#include "ipc/keys.h"
#include "ipc/shm.h"
#include "stages/job/job.h"
#include "tools/cmds.h"

/* Sends req to job's coordinator and prints its reply (stdout if ok, else stderr).
 * Returns the exit status: 0 ok, 1 refused or unreachable. */
static int ask(const char *what, const char *job, msg_t *req, int timeout_s)
{
    char err[512];
    shm_seg_t *seg = NULL;
    if (shm_attach(&seg, job, "job", err, sizeof(err))) {
        fprintf(stderr, "%s: no running job '%s' (%s)\n", what, job, err);
        return 1;
    }
    job_hdr_t h = *(job_hdr_t *)shm_data(seg);
    shm_detach(&seg);
    if (h.magic != JOB_MAGIC || !job_owner_alive(&h)) {
        fprintf(stderr, "%s: job '%s' is not running (its coordinator is gone)\n", what, job);
        return 1;
    }
    if (h.version != JOB_VERSION) {
        fprintf(stderr, "%s: job '%s' runs another version of ctitan (job segment version %u, this one reads %u)\n",
                what, job, h.version, JOB_VERSION);
        return 1;
    }
    h.endpoint[sizeof(h.endpoint) - 1] = 0;
    h.ctl_key[sizeof(h.ctl_key) - 1] = 0;
    h.run_dir[sizeof(h.run_dir) - 1] = 0;
    char id[CTL_ID_MAX], path[sizeof(h.run_dir) + 32];
    snprintf(id, sizeof(id), "cli.%d.0", (int)getpid());
    snprintf(path, sizeof(path), "%s/operator.key", h.run_dir);
    keys_pair_t op;
    if (keys_load_secret(path, &op, err, sizeof(err))) {
        fprintf(stderr, "%s: only the job's operator may ask, and the operator's key is out of reach: %s\n", what,
                err);
        return 1;
    }
    ctl_t *c = NULL;
    int made = ctl_client_new(&c, h.endpoint, id, h.ctl_key, &op, err, sizeof(err));
    memset(&op, 0, sizeof(op));
    if (made) {
        fprintf(stderr, "%s: %s\n", what, err);
        return 1;
    }
    int rc = ctl_send(c, NULL, req), status = 1;
    msg_t m = {0};
    if (rc)
        fprintf(stderr, "%s: cannot reach the coordinator at %s: %s\n", what, h.endpoint, strerror(-rc));
    else if ((rc = ctl_recv(c, timeout_s * 1000, NULL, &m, err, sizeof(err))) == -EAGAIN)
        fprintf(stderr, "%s: no answer from job '%s' in %d s\n", what, job, timeout_s);
    else if (rc)
        fprintf(stderr, "%s: %s\n", what, rc == -EBADMSG ? err : strerror(-rc));
    else if (m.type != MSG_REPLY)
        fprintf(stderr, "%s: unexpected %s from the coordinator\n", what, msg_type_name(m.type));
    else {
        fprintf(m.ok ? stdout : stderr, "%s\n", m.text ? m.text : "");
        status = m.ok ? 0 : 1;
    }
    msg_clear(&m);
    ctl_destroy(&c);
    return status;
}

static void usage_swap(FILE *f)
{
    fprintf(f, "usage: ctitan loader swap --job NAME --cmd \"PROGRAM ARGS...\" [--timeout SECONDS (300)]\n"
               "Replaces the running loader of job NAME at the next step boundary with PROGRAM (built on\n"
               "stages/runtime/ldr.h); it resumes from the loader cursor of that boundary. The command is split\n"
               "into words as a shell would, with '...' and \"...\" quoting, but no shell runs it: pipes,\n"
               "redirections, variables and globs are refused. A program path with a '/' is taken from\n"
               "this directory; other arguments are read in the job's (where it was launched). Only the\n"
               "job's owner may swap (the operator key in the job's run folder). Exits 0 once the new\n"
               "loader runs.\n");
}

int cmd_loader(int argc, char **argv)
{
    const char *job = NULL, *cmd = NULL;
    int timeout = 300;
    int help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    if (argc < 2 || strcmp(argv[1], "swap")) {
        usage_swap(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            usage_swap(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "loader swap: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--job")) job = argv[++i];
        else if (!strcmp(argv[i], "--cmd")) cmd = argv[++i];
        else if (!strcmp(argv[i], "--timeout")) timeout = atoi(argv[++i]);
        else {
            fprintf(stderr, "loader swap: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!job || !cmd || !*cmd || timeout <= 0) {
        fprintf(stderr, "loader swap: --job NAME and a non-empty --cmd are required\n");
        return 2;
    }
    argv_t a;
    char err[256];
    uint8_t packed[ARGV_MAX_BYTES];
    size_t len = 0;
    if (argv_split(cmd, &a, err, sizeof(err))) {
        fprintf(stderr, "loader swap: --cmd: %s\n", err);
        return 2;
    }
    /* the coordinator runs it in the job's working directory, not ours: a relative program
     * path goes as the absolute one it names here */
    char prog[PATH_MAX];
    char *words[ARGV_MAX_WORDS + 1];
    memcpy(words, a.argv, (size_t)(a.argc + 1) * sizeof(char *));
    if (strchr(a.argv[0], '/') && a.argv[0][0] != '/') {
        if (!realpath(a.argv[0], prog)) {
            fprintf(stderr, "loader swap: --cmd: program %s: %s\n", a.argv[0], strerror(errno));
            argv_free(&a);
            return 2;
        }
        words[0] = prog;
    }
    int rc = argv_pack(&(argv_t){.argc = a.argc, .argv = words}, packed, &len);
    argv_free(&a);
    msg_t m = {.type = MSG_SWAP_ARGV};
    if (rc || msg_set_data(&m, packed, len)) {
        fprintf(stderr, "loader swap: %s\n", rc ? "the command is too long" : "out of memory");
        return 1;
    }
    int status = ask("loader swap", job, &m, timeout);
    msg_clear(&m);
    return status;
}

int cmd_status(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--job")) {
        msg_t m = {.type = MSG_STATUS};
        return ask("status", argv[2], &m, 10);
    }
    int help = argc == 2 && !strcmp(argv[1], "--help");
    fprintf(help ? stdout : stderr, "usage: ctitan status --job NAME\nSays which step a running job is at, and how "
            "many times it was restarted (with the last restart's reason).\n");
    return help ? 0 : 2;
}
