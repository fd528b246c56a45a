/* CURVE keys and key files (see keys.h): fresh pairs, reading key files with every line
 * checked, writing them the way `ctitan ckpt keygen` does. */
#include "ipc/keys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "ipc/util.h"

#define KEYS_LINE_MAX 1024 /* of a key file */

static const char z85_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

int keys_pair_new(keys_pair_t *k, char *err, size_t errlen)
{
    if (zmq_curve_keypair(k->pub, k->sec) != 0)
        return util_fail(err, errlen, -errno, "cannot make a CURVE key pair: %s (libzmq built without CURVE?)",
                         zmq_strerror(errno));
    return 0;
}

bool keys_is_z85(const char *s)
{
    if (strlen(s) != KEYS_Z85)
        return false;
    for (const char *p = s; *p; p++)
        if (!strchr(z85_chars, *p))
            return false;
    return true;
}

int keys_public(const char *secret, char pub[KEYS_Z85 + 1])
{
    if (strlen(secret) != KEYS_Z85)
        return -EINVAL;
    return zmq_curve_public(pub, secret) == 0 ? 0 : (errno == ENOTSUP ? -ENOTSUP : -EINVAL);
}

/* A line is blank, a comment (first non-blank character '#'), or a key of exactly 40 Z85
 * characters, optionally followed by blanks and a '#' comment. A key is tried first because
 * '#' is a Z85 character too. */
int keys_load(const char *path, uint8_t (*keys)[32], char (*z85)[KEYS_Z85 + 1], int max, bool all, int *n,
              char *err, size_t errlen)
{
    *n = 0;
    size_t size;
    int fd = util_open_regular(path, &size, err, errlen); /* a FIFO is refused, never waited on */
    if (fd < 0)
        return fd;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        int e = errno;
        close(fd);
        return util_fail(err, errlen, -e, "%s: cannot open: %s", path, strerror(e));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0, lineno = 0;
    while ((all || *n < 1) && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > KEYS_LINE_MAX || memchr(line, '\0', (size_t)len)) {
            rc = util_fail(err, errlen, -EINVAL, "%s:%d: not a key file (line too long or binary)", path, lineno);
            goto out;
        }
        char *p = line + strspn(line, " \t\r\n");
        if (!*p)
            continue;
        size_t tok = strcspn(p, " \t\r\n");
        char *rest = p + tok;
        rest += strspn(rest, " \t\r\n");
        bool is_z85 = tok == KEYS_Z85;
        for (size_t i = 0; i < tok && is_z85; i++)
            is_z85 = p[i] && strchr(z85_chars, p[i]) != NULL;
        if (!is_z85 || (*rest && *rest != '#')) {
            if (*p == '#')
                continue;
            if (tok != KEYS_Z85)
                rc = util_fail(err, errlen, -EINVAL, "%s:%d: expected a key of %d Z85 characters, found %zu characters",
                               path, lineno, KEYS_Z85, tok);
            else if (!is_z85)
                rc = util_fail(err, errlen, -EINVAL, "%s:%d: expected a key of %d Z85 characters, found a character "
                               "that is not Z85", path, lineno, KEYS_Z85);
            else
                rc = util_fail(err, errlen, -EINVAL, "%s:%d: unexpected text after the key (comments start with '#')",
                               path, lineno);
            goto out;
        }
        if (*n == max) {
            rc = util_fail(err, errlen, -E2BIG, "%s:%d: more than %d keys", path, lineno, max);
            goto out;
        }
        char z[KEYS_Z85 + 1];
        memcpy(z, p, KEYS_Z85);
        z[KEYS_Z85] = '\0';
        uint8_t bin[32];
        if (!zmq_z85_decode(bin, z)) {
            rc = util_fail(err, errlen, -EINVAL, "%s:%d: not a valid Z85 key", path, lineno);
            goto out;
        }
        if (keys)
            memcpy(keys[*n], bin, 32);
        if (z85)
            memcpy(z85[*n], z, sizeof z);
        (*n)++;
    }
    if (ferror(f))
        rc = util_fail(err, errlen, -EIO, "%s: read error", path);
    else if (*n == 0)
        rc = util_fail(err, errlen, -EINVAL, "%s: no key in the file (expected a line of %d Z85 characters)", path,
                       KEYS_Z85);
out:
    free(line);
    fclose(f);
    return rc;
}

int keys_load_one(const char *path, char key[KEYS_Z85 + 1], char *err, size_t errlen)
{
    char z[1][KEYS_Z85 + 1];
    int n, rc = keys_load(path, NULL, z, 1, false, &n, err, errlen);
    if (!rc)
        memcpy(key, z[0], KEYS_Z85 + 1);
    return rc;
}

int keys_load_secret(const char *path, keys_pair_t *k, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return util_fail(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    if (st.st_mode & 077)
        return util_fail(err, errlen, -EPERM, "%s: a secret key others can read (mode %04o); chmod 600 %s", path,
                         (unsigned)(st.st_mode & 07777), path);
    int rc = keys_load_one(path, k->sec, err, errlen);
    if (rc)
        return rc;
    if (keys_public(k->sec, k->pub) != 0)
        return util_fail(err, errlen, -EINVAL, "%s: not a CURVE secret key (this libzmq has CURVE: %s)", path,
                         zmq_has("curve") ? "yes" : "no");
    return 0;
}

int keys_write_file(const char *path, const char *text, unsigned mode, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
    if (fd < 0)
        return util_fail(err, errlen, -errno, errno == EEXIST ? "%s exists: not overwriting a key"
                                                              : "%s: cannot create: %s", path, strerror(errno));
    int rc = fchmod(fd, (mode_t)mode) ? -errno : 0; /* whatever the umask */
    if (!rc)
        rc = util_write_all(fd, text, strlen(text));
    if (!rc && fsync(fd) != 0)
        rc = -errno;
    if (close(fd) != 0 && !rc)
        rc = -errno;
    if (rc) {
        unlink(path);
        return util_fail(err, errlen, rc, "%s: cannot write: %s", path, strerror(-rc));
    }
    return 0;
}

int keys_gen(const char *prefix, char *err, size_t errlen)
{
    char kpath[PATH_MAX], ppath[PATH_MAX];
    if (snprintf(kpath, sizeof kpath, "%s.key", prefix) >= (int)sizeof kpath ||
        snprintf(ppath, sizeof ppath, "%s.pub", prefix) >= (int)sizeof ppath)
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: name too long", prefix);
    if (access(ppath, F_OK) == 0) /* before creating the secret one */
        return util_fail(err, errlen, -EEXIST, "%s exists: not overwriting a key", ppath);
    keys_pair_t k;
    int rc = keys_pair_new(&k, err, errlen);
    if (rc)
        return rc;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const char *base = strrchr(prefix, '/') ? strrchr(prefix, '/') + 1 : prefix;
    char text[512];
    snprintf(text, sizeof text, "# ctitan CURVE secret key; its public key is in %s.pub. Keep it private.\n%s\n",
             base, k.sec);
    if ((rc = keys_write_file(kpath, text, 0600, err, errlen)))
        return rc;
    snprintf(text, sizeof text, "%s # %s.pub from %s\n", k.pub, base, host);
    if ((rc = keys_write_file(ppath, text, 0644, err, errlen)))
        unlink(kpath);
    return rc;
}
