/* `ctitan loader swap --job NAME --cmd "..."`: asks a running job's coordinator to replace
 * its loader at the next step boundary, and waits for the outcome. The job is found through
 * its shared segment, which records the coordinator's control endpoint. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/ctl.h"
#include "ipc/shm.h"
#include "stages/job.h"
#include "tools/cmds.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ctitan loader swap --job NAME --cmd \"COMMAND\" [--timeout SECONDS (300)]\n"
               "Replaces the running loader of job NAME at the next step boundary with COMMAND\n"
               "(run as `sh -c \"exec COMMAND\"`, a program built on stages/ldr.h); it resumes from\n"
               "the loader cursor of that boundary. Exits 0 once the new loader runs.\n");
}

int cmd_loader(int argc, char **argv)
{
    const char *job = NULL, *cmd = NULL;
    int timeout = 300;
    if (argc < 2 || strcmp(argv[1], "swap")) {
        usage(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
        return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            usage(stdout);
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
    char err[512];
    shm_seg_t *seg = NULL;
    if (shm_attach(&seg, job, "job", err, sizeof(err))) {
        fprintf(stderr, "loader swap: no running job '%s' (%s)\n", job, err);
        return 1;
    }
    job_hdr_t h = *(job_hdr_t *)shm_data(seg);
    shm_detach(&seg);
    if (h.magic != JOB_MAGIC || !job_owner_alive(&h)) {
        fprintf(stderr, "loader swap: job '%s' is not running (its coordinator is gone)\n", job);
        return 1;
    }
    h.endpoint[sizeof(h.endpoint) - 1] = 0;
    char id[CTL_ID_MAX];
    snprintf(id, sizeof(id), "cli.%d.0", (int)getpid());
    ctl_t *c = NULL;
    if (ctl_client_new(&c, h.endpoint, id, err, sizeof(err))) {
        fprintf(stderr, "loader swap: %s\n", err);
        return 1;
    }
    msg_t m = {.type = MSG_SWAP};
    int rc = msg_set_text(&m, cmd);
    if (!rc)
        rc = ctl_send(c, NULL, &m);
    msg_clear(&m);
    if (rc) {
        fprintf(stderr, "loader swap: cannot reach the coordinator at %s: %s\n", h.endpoint, strerror(-rc));
        ctl_destroy(&c);
        return 1;
    }
    rc = ctl_recv(c, timeout * 1000, NULL, &m, err, sizeof(err));
    int status = 1;
    if (rc == -EAGAIN)
        fprintf(stderr, "loader swap: no answer from job '%s' in %d s\n", job, timeout);
    else if (rc)
        fprintf(stderr, "loader swap: %s\n", rc == -EBADMSG ? err : strerror(-rc));
    else if (m.type != MSG_REPLY)
        fprintf(stderr, "loader swap: unexpected %s from the coordinator\n", msg_type_name(m.type));
    else {
        fprintf(m.ok ? stdout : stderr, "%s\n", m.text ? m.text : "");
        status = m.ok ? 0 : 1;
    }
    msg_clear(&m);
    ctl_destroy(&c);
    return status;
}
