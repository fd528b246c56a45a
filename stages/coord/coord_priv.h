/* The coordinator's state and the functions its files share. PRIVATE to the coordinator:
 * only stages/coord*.c include this; everything else goes through coord.h (coord_run).
 * One concern per file, each readable without the others:
 *
 *   coord.c         coord_run: set-up, start, the step loop (one step in step()), the end;
 *                   coord_fail, and the watch of the coordinator's own stops
 *   coord_setup.c   before any process starts: the endpoint, the data check, signals, segments
 *   coord_proc.c    the process table and supervision: spawn, reap, heartbeats, stop and
 *                   terminate
 *   coord_agent.c   job.hosts > 1: the agent of host k > 0 (its workers started, a death told
 *                   to the coordinator, REWIND carried out) and host 0's side of it
 *   coord_recover.c in-place recovery: a stage or optimizer shard that died (or hung: the
 *                   step watchdog) replaced alone, the step redone when a stage died in it;
 *                   on the GPU a lost stage replaced with every stage, the shards kept
 *   coord_rewind.c  the same on GPU jobs: every stage and shard started again from the
 *                   newest in-memory snapshot, the steps since then run again
 *   coord_ctl.c     the control plane: the event pump, round trips, who may send what and
 *                   when (the authorization table), one handler per message
 *   coord_keys.c    the job's keys: the coordinator's, the operator's (in the run folder),
 *                   each process start's, the hosts' (job.keys)
 *   coord_swap.c    `ctitan loader swap`, carried out at a step boundary
 *   coord_resume.c  checkpoint.load: the LOAD exchange with checkpointd before the others start
 *   coord_ckpt.c    checkpoints during the run: SNAPSHOT to the shards, SAVE to checkpointd
 *   coord_plane.c   what the data plane's transport needs from the coordinator (NCCL's ids)
 *   coord_report.c  the progress line and metrics of each step; the end-of-run validation
 *                   and sample (stages/report/evaluate.h holds the math)
 *   coord_trace.c   [profiling] trace_file: the run's timeline (stages/runtime/trace.h)
 *   coord_outcome.c what a supervised run tells its supervisor (coord.h coord_outcome_t): how
 *                   far it got, its checkpoints, why it failed; the leftovers of a dead one */
#ifndef CTITAN_COORD_PRIV_H
#define CTITAN_COORD_PRIV_H

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
#include "ipc/ring.h"
#include "ipc/shm.h"
#include "stages/coord/coord.h"
#include "stages/job/job.h"
#include "stages/runtime/ldr.h"
#include "stages/job/manifest.h"
#include "stages/job/schedule.h"
#include "stages/report/tb.h"
#include "stages/runtime/trace.h"
#include "stages/runtime/worker.h"

#define COORD_STARTUP_TIMEOUT_S 120.0
#define COORD_OPERATOR "operator"    /* the user of the operator's key (`ctitan loader swap`, `status`) */
#define COORD_STOP_GRACE_S 5.0
#define COORD_STEP_TIMES 32          /* step times the watchdog's median is taken over */
#define COORD_ABORT_GRACE_S 2.0      /* after the watchdog's SIGABRT (a stack dump), SIGKILL */
#define COORD_REWOUND 1              /* returned up to the step loop: the job went back to c->step */

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
    int snapped;          /* answered the SNAPSHOT of the checkpoint in flight */
    int remap_due;        /* a GPU shard sent REMAP, REMAPPED not back yet (coord_recover.c) */
    int expect_exit;      /* told to stop: its exit is no failure (and it is not started again) */
    int host;             /* job.host_rank of the host it runs on */
    int remote;           /* on another host (its agent started it): pid from its hello, never signalled
                           * or reaped here, supervised by heartbeats only */
    double started, last_hb;
    double replied_at;    /* when its last reply of a round came (the trace's end of its work) */
    int64_t traced_pid;   /* the pid whose trace track is named (0: none yet) */
    msg_t reply;          /* numbers of the last reply (never its text) */
    int lost;             /* died during training: a replacement is due (coord_recover.c) */
    uint64_t progress;    /* its heartbeats' counter, */
    double progress_at;   /* and when it last moved (the step watchdog) */
    double abort_sent;    /* the watchdog sent SIGABRT then (0: not) */
    double hb_killed;     /* killed after this many seconds without a heartbeat (0: not) */
} coord_proc_t;

/* Another host's agent, as host 0 knows it (job.hosts > 1). */
typedef struct {
    char route[CTL_ROUTE_MAX];        /* its socket, from its hello ("" before): where START, REWIND
                                       * and SAVE_PART go */
    int64_t pid;                      /* its pid, from its hello */
    double last_hb;                   /* when it was last heard from (hello, heartbeat, any message) */
    int started;                      /* START was sent to it in this run */
    int written;                      /* its part of the checkpoint in flight is written (WRITTEN) */
} coord_agent_t;

typedef struct {
    manifest_t *m;                    /* ours (coord_run's copy): checkpoint.load gets resolved */
    const coord_super_t *sup;         /* under a supervisor (stages/coord/supervise.h), or NULL */
    coord_outcome_t *out;             /* sup's outcome, or NULL */
    job_layout_t lay;
    char *toml;                       /* the resolved manifest every worker gets */
    char job[96];                     /* this host's segment names: job.name, "-h<k>" on host k > 0 */
    shm_seg_t *seg_job, *seg_params, *seg_grads, *seg_act, *seg_batch, *seg_ckpt, *seg_dev, *seg_opt;
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
    int sigfd;
    char bin_dir[PATH_MAX];
    coord_proc_t *p;                  /* [0] loader, then pp*dp stages, then the shards, then
                                       * checkpointd (checkpoint enable or load), then the other
                                       * hosts' loaders (coord_make_table) */
    int np, n_stages, has_ckptd;
    coord_agent_t *agents;            /* host 0 of job.hosts > 1: [h] the agent of host h > 0 */
    ctl_t *up;                        /* host k > 0: the agent's connection to the coordinator */
    uint8_t loader_argv[ARGV_MAX_BYTES]; /* the loader command, packed (ipc/argv.h); none: built-in */
    size_t loader_argv_len;
    int loader_restarts;
    int swap_pending, trial, trial_failed;
    uint8_t swap_argv[ARGV_MAX_BYTES]; /* the swap asked for, packed */
    size_t swap_argv_len;
    char swap_from[CTL_ROUTE_MAX], trial_why[1024];
    int64_t step;
    /* checkpoint.load: the LOAD exchange (coord_resume.c) */
    int loading;                      /* checkpointd started for a LOAD, LOADED not yet here */
    int load_sent;                    /* ... and LOAD was sent to it */
    int load_ok;
    char load_text[1536];             /* LOADED's text: the directory, "" (none there), or why not */
    int64_t load_step;
    uint8_t resume_cursor[LDR_CURSOR_MAX]; /* the loader's, from the checkpoint resumed */
    uint32_t resume_cursor_len;
    /* checkpoints: at most one in flight, from SNAPSHOT to SAVED (coord_ckpt.c) */
    int ck_busy, ck_snapped, ckptd_restarts;
    int ck_memory;                    /* the snapshot in flight is in memory only (snapshot_interval) */
    int ck_saving;                    /* SAVE sent: checkpointd writes it, SAVED is expected */
    int ck_save_due;                  /* the snapshot is whole but no checkpointd took it yet (a new
                                       * one not ready): SAVE goes when it is */
    int64_t ck_step;
    double ck_t0;
    int ck_started, ck_saved;         /* this run's checkpoints: snapshots begun, SAVED ok */
    int ck_last_saved;                /* that of training.steps was written */
    /* across hosts (job.hosts > 1) a checkpoint is written in parts, one per host, into one
     * temporary directory of checkpoint.folder, then committed by this host's checkpointd */
    char ck_tmp[64];                  /* that directory's name for the attempt in flight */
    int ck_n_written, ck_written0;    /* parts written (WRITTEN), and whether this host's is */
    int ck_committing;                /* COMMIT sent: SAVED is expected */
    uint64_t ck_part_bytes;           /* what the parts wrote, */
    double ck_part_busy;              /* and the longest part's time */
    char ck_part_why[800];            /* the first part that failed and why ("" none) */
    int64_t ck_why_step;              /* the last one that failed saying why, and why */
    char ck_why[1152];
    /* in-place recovery (coord_recover.c) */
    int recover;                      /* a dead stage or shard is replaced alone (CPU jobs, one host); else
                                       * the job rewinds to its newest snapshot (but see restage) */
    int restage;                      /* GPU jobs on one host's IPC plane: a lost stage is replaced with
                                       * every stage, the shards kept (coord_recover.c) */
    int grads_held;                   /* GPU shards: this step's gradients are in the stages' device
                                       * memory only (from STEP until the UPDATE round ends) */
    int64_t first_step;               /* the run's: after the checkpoint it resumed, or 0 */
    int fresh;                        /* the run started from the initial weights (no checkpoint.load) */
    int64_t snap_step;                /* the staging segment holds the whole state after this step (-1: no) */
    double snap_at;                   /* when that step ended */
    int snaps;                        /* snapshots made whole in this run */
    double train_t0;                  /* when the step loop began */
    char start_load[sizeof(((manifest_t *)0)->ckpt_load)]; /* checkpoint.load as the run resolved it */
    uint8_t start_cursor[LDR_CURSOR_MAX]; /* the loader cursor the run started at (START to the agents) */
    uint32_t start_cursor_len;
    int agents_go;                    /* the run knows where it starts: START to every agent that says hello */
    int training;                     /* the step loop runs */
    int n_lost;                       /* processes lost and not replaced yet */
    int redo;                         /* a stage died inside the STEP round: the step runs again */
    double lost_at;                   /* when the first of them was found dead */
    char lost_why[512];               /* what happened to it */
    const coord_proc_t *lost_first;
    int recoveries;                   /* this run's */
    int64_t recover_step;             /* the step of the last recovery, */
    int recover_tries;                /* and how many it has had */
    char last_recovery[600];
    msg_t round;                      /* the round in flight (type 0: none): what a replacement gets again */
    double round_t0;                  /* when its step began */
    double step_times[COORD_STEP_TIMES]; /* the last steps' times, */
    int n_step_times;
    double watchdog_auto_s;           /* and the step watchdog's bound from them (0: too few yet) */
    int failed, interrupted;
    char why[1536];
    const coord_proc_t *culprit;      /* the process the failure is blamed on (NULL: the coordinator's own) */
    /* our own stops (coord.c): a thread notes the time while this process runs */
    pthread_t watch;
    int watching;
    atomic_int watch_quit;
    _Atomic double tick, gap_s, gap_end; /* its last note; its last gap over 0.25 s, and when */
    double continued_at;              /* when a SIGCONT was last seen */
    FILE *metrics;
    sched_t sched;                    /* the stages' schedule: the ideal step and bubble, the trace's ideal track */
    trace_t *trace;                   /* [profiling] trace_file, or NULL */
    tb_t *tb;                         /* metrics.enable_tensorboard: the event file */
    double peak_gflops;
    double entropy;                   /* of the first training file (NaN with a custom loader) */
    void *boot;                       /* what the transport needs made once per run (NCCL: every
                                       * communicator's id; NULL: nothing), coord_plane.c */
    size_t boot_len;
    char first_file[PATH_MAX];        /* the first file loader.dataset_path matches */
} coord_t;

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
/* "stage rank 1 replica 0", "optshard 2", ... */
const char *coord_who(const coord_proc_t *p, char *buf, size_t n);
/* "loader", "stage", "optshard", "checkpointd" */
const char *coord_role_name(coord_role_t role);

/* ---- coord_setup.c ---- */
int coord_resolve_endpoint(coord_t *c, char *err, size_t errlen);
/* The data files before any process starts (sets c->entropy, c->first_file). */
int coord_check_data(coord_t *c, char *err, size_t errlen);
/* SIGCHLD, SIGINT, SIGTERM, SIGHUP through c->sigfd. */
int coord_setup_signals(coord_t *c);
/* Reads pending signals: SIGINT, SIGTERM or SIGHUP set c->interrupted. */
void coord_read_signals(coord_t *c);
/* Every segment of this host but the loader's (refuses a job that runs, clears a stale one). */
int coord_make_segments(coord_t *c, char *err, size_t errlen);
/* The loader's segment, once the first step and its cursor are known (coord_resume). */
int coord_make_batch(coord_t *c, char *err, size_t errlen);
void coord_remove_segments(coord_t *c);

/* ---- coord_proc.c ---- */
int coord_make_table(coord_t *c);
void coord_spawn(coord_t *c, coord_proc_t *p);
/* Reaps exited children: the loader and checkpointd are restarted, anything else fails the job. */
void coord_reap(coord_t *c);
void coord_check_heartbeats(coord_t *c);
/* STOP to one process and waits for its exit (SIGKILL after the grace time). */
void coord_stop_proc(coord_t *c, coord_proc_t *p);
/* Clean stop: STOP to everyone, then signals for whoever lingers. */
void coord_stop_all(coord_t *c);
/* SIGTERM to whoever still runs, `grace` seconds, then SIGKILL; reaps them all. */
void coord_terminate_all(coord_t *c, double grace);
/* "exited with status 1", "was killed by signal 9 (Killed)", ... */
const char *coord_describe_exit(int st, char *buf, size_t n);
/* No child of this process runs. */
int coord_none_running(coord_t *c);

/* ---- coord_agent.c ---- */
/* job.host_rank > 0: connects to the coordinator and waits for its START, starts this host's
 * processes, follows them, tells the coordinator of a lost one, carries out its REWIND and
 * writes this host's part of each checkpoint (SAVE_PART); when the coordinator is lost (its
 * heartbeat answers stop, or another one answers) it stops them and waits for a coordinator
 * again, job.host_timeout_s at most. Returns the exit status. */
int coord_agent(coord_t *c);
/* A message from host h's agent (its key is the host's, its route "agent.<h>..."): its HELLO
 * (where START, REWIND and SAVE_PART go), HEARTBEAT (answered), LOST (a worker of its host
 * died), WRITTEN (its part of a checkpoint). Returns NULL or why it is refused. */
const char *coord_on_agent(coord_t *c, int h, const ctl_peer_t *from, const msg_t *m);
/* START to every agent connected and not started yet: where the run starts (c->step, the
 * checkpoint it resumed). Called once the run knows it, and again for an agent that says hello
 * later. */
void coord_start_agents(coord_t *c);
/* Pump condition: every other host's agent has been sent START. */
int coord_agents_started(coord_t *c, void *arg);
/* The job has ended (done, or stopped by a signal): STOP to every agent, which ends its host's
 * part; sent so that it goes out before the socket closes. */
void coord_stop_agents(coord_t *c);
/* An agent silent for job.heartbeat_timeout_ms (its host died, or is cut off) fails the job;
 * each pump. */
void coord_check_agents(coord_t *c);

/* ---- coord_recover.c ---- */
/* Whether p, dead or hung now, is replaced alone rather than failing the job. */
int coord_can_recover(const coord_t *c, const coord_proc_t *p);
/* p died (`how`): it is replaced before the round in flight can end (coord_recover). */
void coord_lost(coord_t *c, coord_proc_t *p, const char *how);
/* Replaces every lost process; with a stage lost inside the STEP round, every stage leaves the
 * step, the rings, gradients and loader go back to its start, and the step is sent again; a
 * shard gets the round it owed again. A GPU job on one host's IPC plane (c->restage) replaces a
 * lost stage with every stage, the shards keeping their state (GPU shards map the new ones
 * and write their weights: REMAP); other losses of a GPU job rewind it (coord_rewind).
 * Returns 0, COORD_REWOUND (c->step is now the step to run next: the round in flight is void),
 * or -1 once the job failed or was interrupted. */
int coord_recover(coord_t *c);
/* REMAPPED from a GPU shard: it mapped the restarted stages and wrote their weights. */
const char *coord_on_remapped(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
/* fn on every ring between this host's stages (the act segment's), and the loader's too. */
void coord_each_ring(coord_t *c, void (*fn)(ring_t *r), int loader);

/* ---- coord_rewind.c ---- */
/* GPU jobs: every stage, shard and the loader killed and started again from the staging
 * segment's whole snapshot (c->snap_step), or from the run's first step when it started from
 * the initial weights. Sets c->step. Returns 0 once all are ready, 0 with c->n_lost set when
 * one was lost meanwhile (rewind again), or -1 (the job failed: no snapshot to go back to). */
int coord_rewind(coord_t *c);
/* This host's segments as at the start of step `to` (host 0 and every agent): gradients, act
 * rings, device directory and commit records cleared, the loader segment made again at
 * `cursor`, and with from_staging the staging header set to the step. Sets c->step. Returns 0
 * or -errno with err. */
int coord_rewind_segments(coord_t *c, int64_t to, int from_staging, const uint8_t *cursor, size_t len, char *err,
                          size_t errlen);
/* The staging segment's snapshot of `step` is whole (every shard copied its slice), or is
 * being overwritten (step -1). */
void coord_rewind_point(coord_t *c, int64_t step);
/* The step watchdog (each pump): a process that owes a reply and made no progress for the
 * bound is stack-dumped (SIGABRT), then killed; its death is a loss like any other. */
void coord_watchdog(coord_t *c);
/* A step's time, for the watchdog's automatic bound. */
void coord_note_step_time(coord_t *c, double secs);
/* ABORTED from a stage: it left the step in progress. */
const char *coord_on_aborted(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);

/* ---- coord_ctl.c ---- */
/* Handles events until cond(c, arg) holds. Returns 0, -1 once the job failed or was
 * interrupted, or -ETIMEDOUT after `timeout` seconds. */
int coord_pump(coord_t *c, int (*cond)(coord_t *, void *), void *arg, double timeout);
/* Handles control messages for up to `secs` until the job has failed (a worker's report
 * arriving after its exit). */
void coord_drain_errors(coord_t *c, double secs);
void coord_send(coord_t *c, coord_proc_t *p, msg_t *m);
void coord_reply_cli(coord_t *c, const char *to, int ok, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Sends m to procs [first, first+count) and waits for each one's reply to this step. Returns
 * 0, COORD_REWOUND (coord_recover), or -1. */
int coord_round_trip(coord_t *c, int first, int count, msg_t *m);
/* pump conditions */
int coord_all_ready(coord_t *c, void *arg);       /* every process not told to stop */
int coord_proc_gone(coord_t *c, void *proc);
int coord_proc_ready(coord_t *c, void *proc);

/* Message handlers of the other files. coord_ctl.c dispatches after checking the sender's
 * role (p is NULL for the operator's); each handler checks that the message is expected now
 * and returns NULL once it took it, or why not (the pump counts and logs the rejection). */
const char *coord_on_swap(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
const char *coord_on_loaded(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
const char *coord_on_snapped(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
const char *coord_on_saved(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);

/* ---- coord_keys.c ---- */
/* This host's keys: the coordinator's fresh pair, or from job.keys across hosts; on host 0 the
 * run folder with the operator's fresh key. Before the control socket exists. */
int coord_keys_setup(coord_t *c, char *err, size_t errlen);
/* Host 0, once the control socket exists and before it is bound (ZeroMQ never retries a
 * refused client): admits the operator's key, and the hosts'. */
int coord_keys_admit(coord_t *c, char *err, size_t errlen);
/* The keys process p starts with: on host 0 a fresh pair, bound to "<id>@<start>" (the
 * previous start's revoked); on host k the host's pair. Returns 0 or -errno. */
int coord_keys_for(coord_t *c, coord_proc_t *p, worker_keys_t *k);
/* p has exited: its key admits nobody any more. */
void coord_keys_revoke(coord_t *c, coord_proc_t *p);
/* The end of the run: the run folder and the operator's key go. */
void coord_keys_remove(coord_t *c);
/* The same for the run folder of a coordinator that is gone (coord_remove_leftovers). */
void coord_keys_remove_dir(const char *run_dir);

/* ---- coord_swap.c ---- */
/* Replaces the loader at the boundary after step c->step (stages and shards are idle). */
void coord_do_swap(coord_t *c);

/* ---- coord_resume.c ---- */
/* checkpoint.load through checkpointd. Returns 0 (c->step is the first step), -1 when the
 * job failed or was interrupted meanwhile, or -errno with checkpointd's reason in err. */
int coord_resume(coord_t *c, char *err, size_t errlen);
/* The same on a host's agent (job.hosts > 1), which has no control socket for a LOADED: a
 * checkpointd that loads checkpoint directory `dir` into this host's staging segment once and
 * exits (`--load`); its step must be `step`. Returns 0 (the staging header holds the step and
 * the cursor) or -errno with the reason in err. */
int coord_resume_host(coord_t *c, const char *dir, int64_t step, char *err, size_t errlen);

/* ---- coord_ckpt.c ---- */
/* After `done` steps: a snapshot to the staging segment, then checkpointd writes it. Returns
 * 0, COORD_REWOUND (waiting for the previous one, the job was rewound: none is taken) or -1. */
int coord_start_checkpoint(coord_t *c, int64_t done);
/* After `done` steps, none in flight: an in-memory snapshot only (checkpoint.snapshot_interval),
 * what a GPU job rewinds to. */
void coord_start_snapshot(coord_t *c, int64_t done);
/* Waits for the checkpoint in flight. Returns 0, COORD_REWOUND, or -1 once the job failed or
 * was interrupted. */
int coord_ckpt_wait(coord_t *c);
/* Sends SAVE for the whole snapshot when one is due and checkpointd is ready (it is called
 * again when a restarted checkpointd says ready); across hosts SAVE_PART to checkpointd and
 * every agent, each writing its host's part into one temporary directory, a new one per
 * attempt. */
void coord_ckpt_save(coord_t *c);
/* WRITTEN from host `host`'s writer (0: checkpointd, else the agent): once every host's part of
 * the attempt in flight is written, COMMIT (or, when one failed, the whole checkpoint given up). */
const char *coord_on_written(coord_t *c, int host, const msg_t *m);
/* After the last step: a run whose last checkpoint was not written fails (its final state is
 * not saved), saying why and how many of its checkpoints were written. */
void coord_ckpt_check_last(coord_t *c);

/* ---- coord_plane.c ---- */
/* c->boot made anew (plane_boot_make). Returns 0 or -errno with err. */
int coord_make_boot(coord_t *c, char *err, size_t errlen);
/* MSG_NCCL to stage p: its share of c->boot, when it has one. */
void coord_send_boot(coord_t *c, coord_proc_t *p);

/* ---- coord_report.c ---- */
/* "launch: job ...": the model, the topology, the processes, the data; and the peak MFU is
 * against (c->peak_gflops: metrics.peak_tflops, else stages/report/peak_cache.h's) and where it is from. */
void coord_banner(coord_t *c);
/* The progress line and the metrics record of step c->step. */
void coord_report_step(coord_t *c, double norm, double t_step, double t_reduce, double t_update);
/* "done: ...", the validation loss and a sample, from replica 0's final weights. */
void coord_end_of_run(coord_t *c, int64_t first, double secs);

/* ---- coord_trace.c (each does nothing without [profiling] trace_file) ---- */
/* Opens the trace file (a relaunch appends to its run before). Returns 0 or -errno with err. */
int coord_trace_open(coord_t *c, char *err, size_t errlen);
/* MSG_TRACE from stage p: its step's actions and waits, on its track. */
const char *coord_on_trace(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
/* A round of processes [first, first + count) that ran from t0 to t1: a slice on the
 * coordinator's track, and each process's work (its reply's t_busy, ending when it came). */
void coord_trace_round(coord_t *c, const char *name, int first, int count, double t0, double t1);
/* Process p's work of `busy` seconds that ended now (a snapshot, a checkpoint's write). */
void coord_trace_work(coord_t *c, coord_proc_t *p, const char *name, double busy);
/* After step c->step: the schedule's ideal placement with the step's measured action times
 * (t[rank] = F, B, W seconds), on every stage's second track from the step's start; flushed (a
 * failure is said once, and the trace given up). */
void coord_trace_step(coord_t *c, const double (*t)[3]);
void coord_trace_close(coord_t *c);

/* ---- coord_outcome.c (each does nothing without a supervisor) ---- */
/* Training starts after step c->step (the resumed checkpoint's). */
void coord_note_start(coord_t *c);
/* Step c->step has ended. */
void coord_note_step(coord_t *c);
/* A checkpoint of `done` steps begins (its step has just ended), and later: it was saved. */
void coord_note_checkpoint(coord_t *c, int64_t done);
void coord_note_saved(coord_t *c, int64_t step);
/* The run fails with this reason, blamed on c->culprit (NULL: the coordinator). */
void coord_note_failure(coord_t *c, const char *why);

#endif
