/* libFuzzer harness: commands as argument vectors (ipc/argv.h). The first byte picks the
 * decoder: 0, argv_split on the rest as a line (`[loader] command`, `ctitan loader swap --cmd`);
 * otherwise argv_unpack on the rest as the packed words a swap message carries from a peer.
 * Accepted words must pack and unpack to the same words, and the quoted form argv_show gives
 * must split back to them (when it was not truncated). */
#include <string.h>

#include "ipc/argv.h"
#include "tests/fuzz/fuzz.h"

static void same_words(const argv_t *a, const argv_t *b, const char *what)
{
    FUZZ_CHECK(a->argc == b->argc, "%s: %d words became %d", what, a->argc, b->argc);
    for (int i = 0; i < a->argc; i++)
        FUZZ_CHECK(!strcmp(a->argv[i], b->argv[i]), "%s: word %d '%s' became '%s'", what, i, a->argv[i], b->argv[i]);
    FUZZ_CHECK(b->argv[b->argc] == NULL, "%s: argv[argc] is not NULL", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char err[256];
    argv_t a;
    int rc;
    if (data[0] == 0) {
        char *line = malloc(size); /* the rest, NUL-terminated */
        if (!line)
            return 0;
        memcpy(line, data + 1, size - 1);
        line[size - 1] = '\0';
        rc = argv_split(line, &a, err, sizeof(err));
        free(line);
    } else {
        rc = argv_unpack(data + 1, size - 1, &a, err, sizeof(err));
    }
    if (rc) {
        FUZZ_CHECK(a.argv == NULL, "a refused command left words behind (%s)", err);
        return 0;
    }
    FUZZ_CHECK(a.argc >= 1 && a.argc <= ARGV_MAX_WORDS && a.argv[0][0], "accepted: %d words", a.argc);
    static uint8_t packed[ARGV_MAX_BYTES];
    size_t n = 0;
    FUZZ_CHECK(argv_pack(&a, packed, &n) == 0, "accepted words (%d) do not pack", a.argc);
    argv_t b;
    FUZZ_CHECK(argv_unpack(packed, n, &b, err, sizeof(err)) == 0, "packed words do not unpack: %s", err);
    same_words(&a, &b, "pack, unpack");
    argv_free(&b);
    static char shown[4 * ARGV_MAX_BYTES + 64];
    argv_show(&a, shown, sizeof(shown));
    size_t len = strlen(shown);
    if (len + 1 < sizeof(shown)) {
        FUZZ_CHECK(argv_split(shown, &b, err, sizeof(err)) == 0, "shown form '%s' does not split: %s", shown, err);
        same_words(&a, &b, "show, split");
        argv_free(&b);
    }
    argv_free(&a);
    FUZZ_CHECK(a.argv == NULL, "argv_free left the words");
    return 0;
}
