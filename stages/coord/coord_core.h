/* The coordinator's core, PRIVATE to stages/coord/: what every concern of a run shares (the
 * manifest, the job's segments, the control socket, the process table, the step in progress,
 * the failure) and the registry through which the concerns hook themselves in: each message
 * type's handler and who may send it, what runs at every pump, when a process says hello or
 * ready or is restarted, and the recovery's policy for a lost process. The rest is in coord_*.c,
 * a tree: each file calls only files below it (the order of this list, bottom first), the
 * lower ones reach the upper ones only through the registry.
 *
 *   coord_core.c     this: failures, names, the coordinator's own stops, the registry
 *   coord_keys.c     the job's keys: the coordinator's, the operator's, each process start's
 *   coord_setup.c    before any process starts: the endpoint, signals, the job's segments
 *   coord_ctl.c      the control plane: the pump, round trips, who may send what (the table
 *                    the registry fills), the workers' common messages
 *   coord_proc.c     the process table: spawn, reap, heartbeats, stop, the loader's and
 *                    checkpointd's restarts
 *   coord_plane.c    what the data plane's transport needs from the coordinator (NCCL's ids)
 *   coord_outcome.c  what a supervised run tells its supervisor
 *   coord_trace.c    [profiling] trace_file: the run's timeline
 *   coord_watchdog.c the step watchdog
 *   coord_hosts.c    host 0's side of the other hosts' agents
 *   coord_report.c   the data check, the banner, each step's line and metrics, the end
 *   coord_resume.c   checkpoint.load: the LOAD exchange; where the run started
 *   coord_ckpt.c     checkpoints during the run: SNAPSHOT, SAVE, the newest whole snapshot
 *   coord_swap.c     `ctitan loader swap`
 *   coord_rewind.c   GPU jobs: every process again from the newest whole snapshot
 *   coord_recover.c  a lost process replaced in place, with its peers, or by a rewind
 *   coord_agent.c    job.host_rank > 0: the agent of another host
 *   coord.c          coord_run: set-up, start, the step loop, the end */
#ifndef CTITAN_COORD_CORE_H
#define CTITAN_COORD_CORE_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "ipc/argv.h"
#include "ipc/ctl.h"
#include "ipc/keys.h"
#include "ipc/log.h"
#include "ipc/msg.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "stages/coord/coord.h"
#include "stages/job/job.h"
#include "stages/job/manifest.h"
#include "stages/job/schedule.h"

#define COORD_OPERATOR "operator"    /* the user of the operator's key (`ctitan loader swap`, `status`) */
#define COORD_STOP_GRACE_S 5.0
#define COORD_INTERRUPT_GRACE_S 0.3 /* after a Ctrl-C (coord_stop_all_now) */
#define COORD_REWOUND 1              /* returned up to the step loop: the job went back to c->step */
#define COORD_HOOKS 8                /* of each kind in the registry */

typedef enum { COORD_LOADER, COORD_STAGE, COORD_OPTSHARD, COORD_CKPTD } coord_role_t;

typedef struct {
    coord_role_t role;
    int rank, replica;
    char id[CTL_ID_MAX];
    pid_t pid;            /* 0 when not running */
    char user[CTL_USER_MAX];     /* the identity its key carries: "<id>@<start>" (one key per start);
                                  * "" on another host, whose key vouches for all its processes */
    char old_user[CTL_USER_MAX]; /* its previous start's: leftovers from it are ignored quietly */
    char pub[KEYS_Z85 + 1];      /* its key (revoked when it exits) */
    char route[CTL_ROUTE_MAX];   /* its command socket, bound at its hello ("" before) */
    int hello;            /* said HELLO since it was (re)started */
    int ready;            /* said READY since it was (re)started */
    msg_type_t await;     /* the reply it owes in the current round (0: none) */
    int got;              /* replied in the current round */
    int expect_exit;      /* told to stop: its exit is no failure (and it is not started again) */
    int no_restart;       /* its death fails the job (checkpointd while it loads: coord_resume.c) */
    int host;             /* job.host_rank of the host it runs on */
    int remote;           /* on another host (its agent started it): pid from its hello, never signalled
                           * or reaped here, supervised by heartbeats only */
    double started, last_hb;
    double replied_at;    /* when its last reply of a round came (the trace's end of its work) */
    msg_t reply;          /* numbers of the last reply (never its text) */
    int lost;             /* died during training: a replacement is due (coord_recover.c) */
    uint64_t progress;    /* its heartbeats' counter, */
    double progress_at;   /* and when it last moved (the step watchdog) */
    double abort_sent;    /* the watchdog sent SIGABRT then (0: not) */
    double hb_killed;     /* killed after this many seconds without a heartbeat (0: not) */
} coord_proc_t;

typedef struct coord coord_t;

/* A message's handler: p is the sending process (NULL for the operator's and an agent's); it
 * checks that the message is expected now and returns NULL once it took it, or why not (the
 * pump counts and logs the rejection). */
typedef const char *(*coord_handler_t)(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
typedef void (*coord_hook_t)(coord_t *c);
typedef void (*coord_proc_hook_t)(coord_t *c, coord_proc_t *p);
typedef void (*coord_restart_hook_t)(coord_t *c, coord_proc_t *p, const char *how);

#define COORD_FROM(role) (1u << (role))
#define COORD_FROM_WORKERS (COORD_FROM(COORD_LOADER) | COORD_FROM(COORD_STAGE) | COORD_FROM(COORD_OPTSHARD) | \
                            COORD_FROM(COORD_CKPTD))
#define COORD_FROM_OPERATOR (1u << 8)
#define COORD_FROM_AGENT (1u << 9)  /* another host's agent (coord_hosts.c checks its route first) */

/* What the concerns hook in (coord_core.c's coord_handle, coord_on_*). */
typedef struct {
    struct {
        coord_handler_t fn;
        unsigned who;             /* COORD_FROM_* bits */
    } rules[MSG_TYPE_END];
    coord_hook_t signal[COORD_HOOKS];      /* a signal came (SIGCHLD: reap) */
    coord_hook_t tick[COORD_HOOKS];        /* after each wait of the pump */
    coord_proc_hook_t hello[COORD_HOOKS];  /* a process said hello (after its config went) */
    coord_proc_hook_t ready[COORD_HOOKS];  /* a process said ready */
    coord_restart_hook_t restart[COORD_HOOKS]; /* checkpointd is about to start again, after it `how` */
    int n_signal, n_tick, n_hello, n_ready, n_restart;
    /* the recovery's policy (coord_recover.c; none: every loss fails the job) */
    int (*can_recover)(const coord_t *c, const coord_proc_t *p); /* p dead or hung now is replaced */
    void (*lost)(coord_t *c, coord_proc_t *p, const char *how);  /* p is gone: replace it */
    int (*recover)(coord_t *c);   /* replace what is lost: 0, COORD_REWOUND or -1 */
} coord_registry_t;

/* Another host's message to host 0's agents' table (coord_hosts.c), before the registry. */
typedef const char *(*coord_agent_handler_t)(coord_t *c, int host, const ctl_peer_t *from, const msg_t *m);

struct coord {
    manifest_t *m;                    /* ours (coord_run's copy): checkpoint.load gets resolved */
    const coord_super_t *sup;         /* under a supervisor (stages/supervise/supervise.h), or NULL */
    coord_outcome_t *out;             /* sup's outcome, or NULL */
    job_layout_t lay;
    char *toml;                       /* the resolved manifest every worker gets */
    char job[96];                     /* this host's segment names: job.name, "-h<k>" on host k > 0 */
    /* the job's segments on this host, made and removed by coord_setup.c */
    shm_seg_t *seg_job, *seg_params, *seg_grads, *seg_act, *seg_batch, *seg_ckpt, *seg_dev, *seg_opt;
    shm_seg_t *seg_fsdp;         /* parameter sharding's exchanges (job.h ctitan.<job>.fsdp), or NULL */
    job_hdr_t *hdr;
    int segs_made;                    /* this run created the job's segments */
    ctl_t *ctl;
    char endpoint[256], sock_path[PATH_MAX];
    /* keys (coord_keys.c) */
    keys_pair_t keys;                 /* host 0: the coordinator's; host k > 0: its workers' (job.keys) */
    char server_pub[KEYS_Z85 + 1];    /* the coordinator's public key, which every worker trusts */
    char run_dir[1000];               /* host 0: the 0700 folder of the operator's key ("" before it exists) */
    int starts;                       /* process starts so far: start k's key is bound to "<id>@k" */
    log_limit_t rejected;             /* control messages rejected (the pump counts and logs them) */
    log_limit_t unanswered;           /* operator replies that could not be sent (a client that
                                       * does not read them): logged at the same bounded rate */
    int sigfd;
    char bin_dir[PATH_MAX];
    /* the process table (coord_proc.c) */
    coord_proc_t *p;                  /* [0] loader, then pp*dp stages, then the shards, then
                                       * checkpointd (checkpoint enable or load), then the other
                                       * hosts' loaders (coord_make_table) */
    int np, n_stages, has_ckptd;
    int loader_restarts, ckptd_restarts;
    uint8_t loader_argv[ARGV_MAX_BYTES]; /* the loader command, packed (ipc/argv.h); none: built-in */
    size_t loader_argv_len;
    struct {                          /* a process on trial (coord_swap.c's new loader): its failure */
        const coord_proc_t *p;        /* before it is ready is noted here, not the job's (NULL: none) */
        int failed;
        char why[1024];
    } trial;
    void *boot;                       /* what the transport needs made once per run (NCCL: every
                                       * communicator's id; NULL: nothing), coord_plane.c */
    size_t boot_len;
    /* the step in progress */
    int64_t step;
    int training;                     /* the step loop runs */
    double train_t0;                  /* when it began */
    msg_t round;                      /* the round in flight (type 0: none): what a replacement gets again */
    double round_t0;                  /* when its step began */
    int grads_held;                   /* GPU shards: this step's gradients are in the stages' device
                                       * memory only (from STEP until the UPDATE round ends) */
    int n_lost;                       /* processes lost and not replaced yet (coord_recover.c) */
    /* the end */
    int failed, interrupted;
    util_every_t setup_say;           /* set-up's progress lines: from when it began (util_say_s) */
    char why[1536];
    const coord_proc_t *culprit;      /* the process the failure is blamed on (NULL: the coordinator's own) */
    /* our own stops: a thread notes the time while this process runs */
    pthread_t watch;
    int watching;
    atomic_int watch_quit;
    _Atomic double tick, gap_s, gap_end; /* its last note; its last gap over 0.25 s, and when */
    double continued_at;              /* when a SIGCONT was last seen */
    coord_registry_t reg;
    coord_agent_handler_t on_agent;   /* host 0 across hosts: coord_hosts.c */
    /* each concern's own state, known only to its file */
    sched_t sched;                    /* the stages' schedule: the ideal step and bubble, the trace's ideal track */
    struct coord_ckpt *ck;
    struct coord_recovery *rec;
    struct coord_watchdog *wd;
    struct coord_resume *res;
    struct coord_swap *swap;
    struct coord_trace *tr;
    struct coord_report *rep;
    struct coord_hosts *hosts;
};

/* job.startup_timeout_s: how long a process may take to become ready. */
static inline double coord_startup_s(const coord_t *c) { return (double)c->m->startup_timeout_s; }

static inline coord_proc_t *coord_loader(coord_t *c) { return &c->p[0]; }
static inline coord_proc_t *coord_stage(coord_t *c, int rank, int replica)
{
    return &c->p[1 + replica * c->m->pp + rank];
}
static inline coord_proc_t *coord_shard(coord_t *c, int k) { return &c->p[1 + c->n_stages + k]; }
/* The processes a GPU job's rewind starts again: all but checkpointd, on every host. */
static inline int coord_n_workers(const coord_t *c) { return c->np - c->has_ckptd; }
static inline coord_proc_t *coord_ckptd(coord_t *c)
{
    return c->has_ckptd ? &c->p[1 + c->n_stages + c->m->shards] : NULL;
}

/* The job fails with this reason (the first one wins: what follows is fallout). Right after
 * the coordinator itself was stopped (SIGSTOP) for much of the heartbeat timeout, the reason is
 * that: its workers gave up on it, and the one found gone first is only named after it. */
void coord_fail(coord_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same, blaming process p (the supervisor's restart record names its role and rank). */
void coord_fail_proc(coord_t *c, const coord_proc_t *p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Whether the job has failed or was interrupted. */
static inline int coord_over(const coord_t *c) { return c->failed || c->interrupted; }
/* "stage rank 1 replica 0", "optshard 2", ... */
const char *coord_who(const coord_proc_t *p, char *buf, size_t n);
/* "loader", "stage", "optshard", "checkpointd" */
const char *coord_role_name(coord_role_t role);
/* "exited with status 1", "was killed by signal 9 (Killed)", ... */
const char *coord_describe_exit(int st, char *buf, size_t n);
/* The host an agent's peer speaks for ("host.K" keys), or -1. */
int coord_peer_host(const ctl_peer_t *from);

/* The watch of the coordinator's own stops: started once the signal mask is set (the thread
 * inherits it); coord_stopped_for (coord_fail's reading of it) is looked at once per step. */
void coord_watch_start(coord_t *c);
void coord_watch_stop(coord_t *c);
double coord_stopped_for(coord_t *c);

/* ---- the registry ---- */
void coord_handle(coord_t *c, msg_type_t type, unsigned who, coord_handler_t fn);
void coord_on_signal(coord_t *c, coord_hook_t fn);
void coord_on_tick(coord_t *c, coord_hook_t fn);
void coord_on_hello(coord_t *c, coord_proc_hook_t fn);
void coord_on_ready(coord_t *c, coord_proc_hook_t fn);
void coord_on_restart(coord_t *c, coord_restart_hook_t fn);
/* Runs the hooks of one kind. */
void coord_run_hooks(coord_t *c, coord_proc_hook_t *hooks, int n, coord_proc_t *p);
/* Whether p, dead or hung now, is replaced rather than failing the job (the recovery's policy). */
int coord_can_recover(const coord_t *c, const coord_proc_t *p);
/* p died (`how`): it is replaced before the round in flight can end. */
void coord_lost(coord_t *c, coord_proc_t *p, const char *how);

#endif
