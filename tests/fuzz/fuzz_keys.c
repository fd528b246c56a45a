/* libFuzzer harness: key files (ipc/keys.h keys_load), the operator's, the hosts' and remote
 * checkpointd's allow file, all read before anything is trusted. Every key accepted must be 40
 * Z85 characters whose binary form is the one returned, and reading only the first key must
 * give the first of all the keys. */
#include <string.h>
#include <zmq.h>

#include "ipc/keys.h"
#include "tests/fuzz/fuzz.h"

#define MAX 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    if (!path)
        return 0;
    char err[512];
    uint8_t bin[MAX][32];
    char z[MAX][KEYS_Z85 + 1];
    int n = -1;
    int rc = keys_load(path, bin, z, MAX, true, &n, err, sizeof(err));
    if (rc) {
        FUZZ_CHECK(strstr(err, path) != NULL, "an error that does not name the file: %s", err);
        return 0;
    }
    FUZZ_CHECK(n >= 1 && n <= MAX, "%d keys", n);
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(keys_is_z85(z[i]), "key %d '%s' is not 40 Z85 characters", i, z[i]);
        uint8_t check[32];
        FUZZ_CHECK(zmq_z85_decode(check, z[i]) && !memcmp(check, bin[i], 32), "key %d: binary form differs", i);
    }
    char one[KEYS_Z85 + 1];
    FUZZ_CHECK(keys_load_one(path, one, err, sizeof(err)) == 0, "all keys read but not the first: %s", err);
    FUZZ_CHECK(!strcmp(one, z[0]), "first key '%s', of all '%s'", one, z[0]);
    return 0;
}
