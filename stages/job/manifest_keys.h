/* The manifest's key table (inside the manifest module: manifest.c, manifest_parse.c,
 * manifest_check.c): every key's section, name, type and field, and where each value came from.
 * The file parser, the overrides, the checks and manifest_to_toml all read it, so a key is
 * added in one place. */
#ifndef CTITAN_MANIFEST_KEYS_H
#define CTITAN_MANIFEST_KEYS_H

#include <limits.h>
#include <stddef.h>

#include "stages/job/manifest.h"

typedef enum {
    MKEY_INT,    /* int */
    MKEY_U64,    /* uint64_t, written as a non-negative TOML integer */
    MKEY_DOUBLE, /* double; TOML integers are accepted too */
    MKEY_BOOL,   /* int 0/1 */
    MKEY_STR,    /* char[size]; too long is an error, never a truncation */
    MKEY_FLAVOR, /* char[size], a config_preset name: re-derives the model config */
    MKEY_SCHED,  /* sched_kind_t by name */
    MKEY_DECAY,  /* lr_decay_t by name */
    MKEY_SPLITS, /* split_points + n_split_points, from ["layers.N", ...] */
    MKEY_AC_MODE, /* int CONFIG_AC_*, by name: "none", "full", "selective" */
    MKEY_AC_OPTION, /* int, from a positive integer (or one as a string) or "op" (0) */
} mkey_type_t;

typedef struct {
    const char *section, *key;
    mkey_type_t type;
    size_t off, size;
    int min;   /* MKEY_INT: smallest valid value (manifest_validate); MKEY_NO_MIN: checked elsewhere */
    int model; /* a model_config_t field: an explicit value is kept over the flavor's */
} mkey_t;

#define MKEY_NO_MIN INT_MIN

/* In the order of manifest_to_toml; a section's keys are contiguous. */
extern const mkey_t mkey_table[];
extern const int mkey_count;

/* origin_line[k]: > 0 the line in m->path, MKEY_OVERRIDE a --section.key, MKEY_DEFAULT the
 * default (for model keys: the flavor's value). */
#define MKEY_DEFAULT 0
#define MKEY_OVERRIDE (-1)

#define MKEY_FLAVOR_LIST "debugmodel, gpt2s, llama1b, tiny" /* config_preset's, for messages */

/* Index of section.key, or -1. */
int mkey_find(const char *section, const char *key);
/* Index of a key named in the manifest module's own code: a miss is a typo there, not bad
 * input, and every call site runs in the tests, so it aborts like an assert. */
int mkey_id(const char *section, const char *key);
int mkey_section_known(const char *section);
/* Whether key k was given (file or override) rather than left to its default. */
int mkey_explicit(const manifest_t *m, int k);
/* "[job], [model], ..." and "GPipe, 1F1B, ..." for messages. */
const char *mkey_section_list(char *buf, size_t len);
const char *mkey_sched_list(char *buf, size_t len);
/* Where key k's value came from: "demo.toml:7", "--training.steps", "default", or for a model
 * key left to the flavor "demo.toml:3 (flavor tiny)". */
const char *mkey_origin(const manifest_t *m, int k, char *buf, size_t len);

#endif
