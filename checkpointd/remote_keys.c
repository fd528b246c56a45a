/* Remote checkpointd's key files (see remote.h): the trainer's and the server's secret keys,
 * the server's allow file of trainers' public keys, `ctitan ckpt keygen`. The files are those
 * of ipc/keys.h, which the control plane's keys share; these are its names inside remote. */
#include "checkpointd/remote_int.h"

#include <string.h>

#include "ipc/keys.h"

_Static_assert(RMT_KEY_Z85 == KEYS_Z85, "one key length");

int rmt_keys_load(const char *path, uint8_t (*keys)[32], char (*z85)[RMT_KEY_Z85 + 1], int max, bool all, int *n,
                  char *err, size_t errlen)
{
    return keys_load(path, keys, z85, max, all, n, err, errlen);
}

int rmt_key_load(const char *path, char key[RMT_KEY_Z85 + 1], char *err, size_t errlen)
{
    return keys_load_one(path, key, err, errlen);
}

int rmt_key_public(const char *secret, char pub[RMT_KEY_Z85 + 1]) { return keys_public(secret, pub); }

int rmt_secret_load(const char *path, char key[RMT_KEY_Z85 + 1], char pub[RMT_KEY_Z85 + 1], char *err,
                    size_t errlen)
{
    keys_pair_t k;
    int rc = keys_load_secret(path, &k, err, errlen);
    if (!rc) {
        memcpy(key, k.sec, sizeof k.sec);
        memcpy(pub, k.pub, sizeof k.pub);
    }
    return rc;
}

int rmt_keygen(const char *prefix, char *err, size_t errlen) { return keys_gen(prefix, err, errlen); }
