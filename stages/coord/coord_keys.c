/* The job's keys (see coord_keys.h and DESIGN.md "Trust"). On one host everything is fresh at
 * each launch and never written where others can read it: the coordinator's server key, one
 * key per process start (handed over in a pipe, bound by the ZAP handler to "<id>@<start>",
 * revoked when the process exits), and the operator's key in the run folder
 * (<dump_folder>/run, mode 0700: operator.key 0600 and coordinator.pub), which `ctitan loader
 * swap` and `ctitan status` must read to be heard. Across hosts the operator gives the keys:
 * job.keys names a folder with host<K>.key (that host's secret key) and host<K>.pub, made
 * with `ctitan ckpt keygen`; host 0's is the coordinator's, host K's the key of all its
 * workers, bound to "host.K". */
#include "stages/coord/coord_keys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc/util.h"

/* What a run leaves in its run folder, removed at its end (and before it starts). */
static const char *const run_files[] = {"operator.key", "coordinator.pub"};

static int host_key_path(const coord_t *c, char *buf, size_t n, int host, const char *ext)
{
    int k = snprintf(buf, n, "%s/host%d.%s", c->m->job_keys, host, ext);
    return k < 0 || (size_t)k >= n ? -ENAMETOOLONG : 0;
}

/* job.hosts > 1: this host's key pair and the coordinator's public key from job.keys. */
static int host_keys(coord_t *c, char *err, size_t errlen)
{
    char path[PATH_MAX];
    int me = c->m->host_rank, rc;
    if (!c->m->job_keys[0])
        return util_fail(err, errlen, -EINVAL, "job.hosts = %d: job.keys must name the folder of the hosts' "
                         "control-plane keys (host<K>.key and host<K>.pub for K = 0 .. %d, from `ctitan ckpt keygen "
                         "FOLDER/host<K>`)", c->m->hosts, c->m->hosts - 1);
    if ((rc = host_key_path(c, path, sizeof(path), me, "key")))
        return util_fail(err, errlen, rc, "job.keys %s: name too long", c->m->job_keys);
    if ((rc = keys_load_secret(path, &c->keys, err, errlen)))
        return rc;
    if (me == 0) {
        memcpy(c->server_pub, c->keys.pub, sizeof(c->server_pub));
        return 0;
    }
    host_key_path(c, path, sizeof(path), 0, "pub");
    return keys_load_one(path, c->server_pub, err, errlen);
}

/* <dump_folder>/run, ours and 0700, without the files of an earlier run. */
static int make_run_dir(coord_t *c, char *err, size_t errlen)
{
    char abs[PATH_MAX], path[PATH_MAX + 32];
    if (!realpath(c->m->dump_folder, abs))
        return util_fail(err, errlen, -errno, "job.dump_folder %s: %s", c->m->dump_folder, strerror(errno));
    if (strlen(abs) + 4 >= sizeof(c->run_dir))
        return util_fail(err, errlen, -ENAMETOOLONG, "job.dump_folder %s: name too long", abs);
    snprintf(path, sizeof(path), "%s/run", abs);
    struct stat st;
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return util_fail(err, errlen, -errno, "%s: cannot create: %s", path, strerror(errno));
    if (lstat(path, &st) != 0)
        return util_fail(err, errlen, -errno, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())
        return util_fail(err, errlen, -EPERM, "%s: not a folder of this user's: it holds the job's operator key, "
                         "remove it", path);
    if (chmod(path, 0700) != 0)
        return util_fail(err, errlen, -errno, "%s: cannot make it private: %s", path, strerror(errno));
    snprintf(c->run_dir, sizeof(c->run_dir), "%.990s/run", abs); /* fits: checked above */
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", c->run_dir, run_files[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            return util_fail(err, errlen, -errno, "%s: cannot remove the earlier run's: %s", path, strerror(errno));
    }
    return 0;
}

/* The operator's fresh key: operator.key (0600), and coordinator.pub beside it. */
static int write_run_keys(coord_t *c, const keys_pair_t *op, char *err, size_t errlen)
{
    char path[sizeof(c->run_dir) + 32], text[512];
    snprintf(path, sizeof(path), "%s/operator.key", c->run_dir);
    snprintf(text, sizeof(text), "# ctitan: the operator's secret key of job %s (coordinator pid %d), for `ctitan "
             "loader swap` and `ctitan status`. Keep it private.\n%s\n", c->m->name, (int)getpid(), op->sec);
    int rc = keys_write_file(path, text, 0600, err, errlen);
    if (rc)
        return rc;
    snprintf(path, sizeof(path), "%s/coordinator.pub", c->run_dir);
    snprintf(text, sizeof(text), "%s # the coordinator of job %s\n", c->server_pub, c->m->name);
    return keys_write_file(path, text, 0644, err, errlen);
}

int coord_keys_setup(coord_t *c, char *err, size_t errlen)
{
    int rc = c->m->hosts > 1 ? host_keys(c, err, errlen) : keys_pair_new(&c->keys, err, errlen);
    if (rc)
        return rc;
    if (c->m->hosts == 1)
        memcpy(c->server_pub, c->keys.pub, sizeof(c->server_pub));
    return 0;
}

int coord_keys_allow_hosts(coord_t *c, char *err, size_t errlen)
{
    for (int h = 1; h < c->m->hosts; h++) {
        char path[PATH_MAX], pub[KEYS_Z85 + 1], user[CTL_USER_MAX];
        host_key_path(c, path, sizeof(path), h, "pub");
        int rc = keys_load_one(path, pub, err, errlen);
        if (rc)
            return rc;
        snprintf(user, sizeof(user), "host.%d", h);
        if (ctl_allow(c->ctl, pub, user))
            return util_fail(err, errlen, -EINVAL, "%s: not a CURVE public key", path);
    }
    return 0;
}

int coord_keys_admit(coord_t *c, char *err, size_t errlen)
{
    keys_pair_t op;
    int rc;
    if ((rc = make_run_dir(c, err, errlen)) || (rc = keys_pair_new(&op, err, errlen)))
        return rc;
    if (ctl_allow(c->ctl, op.pub, COORD_OPERATOR))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if ((rc = write_run_keys(c, &op, err, errlen)))
        return rc;
    memset(&op, 0, sizeof(op));
    if ((rc = coord_keys_allow_hosts(c, err, errlen)))
        return rc;
    snprintf(c->hdr->run_dir, sizeof(c->hdr->run_dir), "%s", c->run_dir);
    snprintf(c->hdr->ctl_key, sizeof(c->hdr->ctl_key), "%s", c->server_pub);
    return 0;
}

int coord_keys_for(coord_t *c, coord_proc_t *p, worker_keys_t *k)
{
    memcpy(k->server, c->server_pub, sizeof(k->server));
    if (c->m->host_rank > 0) {
        k->me = c->keys;
        return 0;
    }
    int rc = keys_pair_new(&k->me, NULL, 0);
    if (rc)
        return rc;
    coord_keys_revoke(c, p);
    snprintf(p->old_user, sizeof(p->old_user), "%s", p->user);
    snprintf(p->user, sizeof(p->user), "%.40s@%d", p->id, ++c->starts);
    memcpy(p->pub, k->me.pub, sizeof(p->pub));
    return ctl_allow(c->ctl, p->pub, p->user);
}

void coord_keys_revoke(coord_t *c, coord_proc_t *p)
{
    if (c->ctl && p->pub[0])
        ctl_revoke(c->ctl, p->pub);
    p->pub[0] = '\0';
}

void coord_keys_remove_dir(const char *run_dir)
{
    char path[PATH_MAX];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%.4000s/%s", run_dir, run_files[i]);
        unlink(path);
    }
    rmdir(run_dir);
}

void coord_keys_remove(coord_t *c)
{
    if (!c->run_dir[0])
        return;
    coord_keys_remove_dir(c->run_dir);
    memset(&c->keys, 0, sizeof(c->keys));
}
