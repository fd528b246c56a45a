/* CURVE keys (ZeroMQ's Curve25519) as 40-character Z85 text: fresh pairs, and key files in the
 * one form every ctitan key takes: `ctitan ckpt keygen`'s PREFIX.key (a secret key, mode 0600)
 * and PREFIX.pub, the job's run folder (stages/coord/coord_keys.c), remote checkpointd's allow file.
 * A file holds one key per line, '#' comments allowed on their own line or after a key.
 * Used by the control plane (ipc/ctl.h), the coordinator and remote checkpointd (checkpointd/
 * remote.h). Functions return 0 or -errno and say why in err; nothing here exits. */
#ifndef CTITAN_KEYS_H
#define CTITAN_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KEYS_Z85 40

typedef struct {
    char pub[KEYS_Z85 + 1];
    char sec[KEYS_Z85 + 1];
} keys_pair_t;

/* A fresh key pair from the system's random source. */
int keys_pair_new(keys_pair_t *k, char *err, size_t errlen);
/* The public key of a secret key (both Z85). Returns 0, -EINVAL or -ENOTSUP (no CURVE). */
int keys_public(const char *secret, char pub[KEYS_Z85 + 1]);
/* Whether s is exactly KEYS_Z85 characters of Z85. */
bool keys_is_z85(const char *s);

/* Reads the first key (all: every key, at most max) of a key file into keys (binary, may be
 * NULL) and z85 (may be NULL); *n gets the count. Errors name the file and the line. */
int keys_load(const char *path, uint8_t (*keys)[32], char (*z85)[KEYS_Z85 + 1], int max, bool all, int *n,
              char *err, size_t errlen);
/* The first key of a key file (41 bytes, NUL-terminated Z85). */
int keys_load_one(const char *path, char key[KEYS_Z85 + 1], char *err, size_t errlen);
/* A secret key file and its public key, refused like ssh does when others can read it (-EPERM). */
int keys_load_secret(const char *path, keys_pair_t *k, char *err, size_t errlen);

/* Writes a new key file (never replacing one: -EEXIST) of mode 0600 or 0644 whatever the
 * umask: text, then fsync. */
int keys_write_file(const char *path, const char *text, unsigned mode, char *err, size_t errlen);
/* PREFIX.key (secret, 0600) and PREFIX.pub of a fresh pair; never overwrites either. */
int keys_gen(const char *prefix, char *err, size_t errlen);

#endif
