/* libFuzzer harness: the TOML reader under the manifest (stages/job/toml.h), both ways it is
 * called: a whole file (toml_parse) and one command-line override value (toml_parse_value). */
#include <string.h>

#include "stages/job/toml.h"
#include "tests/fuzz/fuzz.h"

/* Every array's items are there and every string is NUL-terminated UTF-8 of its own length. */
static void check_value(const toml_value_t *v, int depth)
{
    FUZZ_CHECK(depth <= TOML_MAX_DEPTH + 1, "array nesting %d", depth);
    if (v->type == TOML_STRING)
        FUZZ_CHECK(v->s && toml_utf8_invalid_at(v->s, strlen(v->s)) < 0, "string not UTF-8");
    if (v->type == TOML_ARRAY)
        for (int i = 0; i < v->n; i++)
            check_value(&v->items[i], depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    toml_doc_t doc;
    if (toml_parse(&doc, (const char *)data, size, "fuzz.toml", err, sizeof(err)) == 0) {
        FUZZ_CHECK(doc.n_entries + doc.n_sections <= TOML_MAX_ENTRIES, "%d entries", doc.n_entries);
        for (int i = 0; i < doc.n_entries; i++) {
            const toml_entry_t *e = &doc.entries[i];
            FUZZ_CHECK(e->section >= -1 && e->section < doc.n_sections, "section %d", e->section);
            check_value(&e->value, 0);
        }
        toml_free(&doc);
    } else {
        FUZZ_CHECK(!strncmp(err, "fuzz.toml:", 10), "message without PATH:LINE: %s", err);
    }
    toml_value_t v;
    if (toml_parse_value(&v, (const char *)data, size, err, sizeof(err)) == 0) {
        check_value(&v, 0);
        toml_value_free(&v);
    }
    return 0;
}
