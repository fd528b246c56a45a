/* The TOML subset reader (see toml.h): one pass over the text with a cursor and a line
 * counter (toml_int.h): table headers and key = value lines into a document, each value read
 * by toml_value.c. */
#include "stages/job/toml_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void toml_value_free(toml_value_t *v)
{
    if (!v)
        return;
    free(v->s);
    for (int i = 0; i < v->n; i++)
        toml_value_free(&v->items[i]);
    free(v->items);
    memset(v, 0, sizeof(*v));
}

void toml_free(toml_doc_t *doc)
{
    for (int i = 0; i < doc->n_sections; i++)
        free(doc->sections[i].name);
    for (int i = 0; i < doc->n_entries; i++) {
        free(doc->entries[i].key);
        toml_value_free(&doc->entries[i].value);
    }
    free(doc->sections);
    free(doc->entries);
    memset(doc, 0, sizeof(*doc));
}

/* Length of the bare name after the '.' at the cursor, to quote a dotted name in full. */
static int dotted_rest(const ps_t *ps)
{
    const char *q = ps->p + 1;
    while (q < ps->end && (toml_is_bare(*q) || *q == '.') && q - ps->p < 64)
        q++;
    return (int)(q - ps->p - 1);
}

static int header(ps_t *ps, toml_doc_t *doc)
{
    char w[16];
    int rc;
    ps->p++;
    if (ps->p < ps->end && *ps->p == '[')
        return toml_perr(ps, "arrays of tables ([[...]]) are not supported");
    toml_skip_ws(ps);
    char *name = toml_bare_key(ps, &rc);
    if (rc)
        return rc;
    if (!name) {
        if (ps->p < ps->end && (*ps->p == '"' || *ps->p == '\''))
            return toml_perr(ps, "quoted section names are not supported");
        return toml_perr(ps, "expected a section name after '[', got %s", toml_what(ps, w, sizeof(w)));
    }
    toml_skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '.')
        rc = toml_perr(ps, "nested tables ([%s.%.*s]) are not supported; use a plain [section]", name,
                  dotted_rest(ps), ps->p + 1);
    else if (ps->p >= ps->end || *ps->p != ']')
        rc = toml_perr(ps, "expected ']' after the section name '%s', got %s", name,
                  toml_what(ps, w, sizeof(w)));
    for (int i = 0; !rc && i < doc->n_sections; i++)
        if (!strcmp(doc->sections[i].name, name))
            rc = toml_perr(ps, "duplicate section [%s] (first on line %d)", name,
                      doc->sections[i].line);
    if (!rc && doc->n_sections + doc->n_entries >= TOML_MAX_ENTRIES)
        rc = toml_perr(ps, "too many sections and keys (at most %d)", TOML_MAX_ENTRIES);
    toml_section_t *sec = NULL;
    if (!rc) {
        sec = realloc(doc->sections, (size_t)(doc->n_sections + 1) * sizeof(*sec));
        if (!sec)
            rc = toml_enomem(ps);
    }
    if (rc) {
        free(name);
        return rc;
    }
    ps->p++;
    doc->sections = sec;
    doc->sections[doc->n_sections++] = (toml_section_t){.name = name, .line = ps->line};
    return 0;
}

static int keyval(ps_t *ps, toml_doc_t *doc, int *cap)
{
    char w[16];
    int rc, line = ps->line;
    char *key = toml_bare_key(ps, &rc);
    if (rc)
        return rc;
    if (!key) {
        if (*ps->p == '"' || *ps->p == '\'')
            return toml_perr(ps, "quoted keys are not supported");
        if (*ps->p == '=')
            return toml_perr(ps, "missing key before '='");
        return toml_perr(ps, "expected a key, got %s", toml_what(ps, w, sizeof(w)));
    }
    toml_skip_ws(ps);
    toml_value_t v = {0};
    if (ps->p < ps->end && *ps->p == '.')
        rc = toml_perr(ps, "dotted keys (%s.%.*s) are not supported; use a [section]", key,
                  dotted_rest(ps), ps->p + 1);
    else if (ps->p >= ps->end || *ps->p != '=')
        rc = toml_perr(ps, "expected '=' after the key '%s', got %s", key, toml_what(ps, w, sizeof(w)));
    if (!rc) {
        ps->p++;
        toml_skip_ws(ps);
        if (toml_at_eol(ps) || *ps->p == '#')
            rc = toml_perr(ps, "missing value for the key '%s'", key);
    }
    if (!rc)
        rc = toml_value(ps, &v);
    int section = doc->n_sections - 1;
    for (int i = doc->n_entries - 1; !rc && i >= 0 && doc->entries[i].section == section; i--)
        if (!strcmp(doc->entries[i].key, key)) {
            ps->line = line;
            rc = toml_perr(ps, "duplicate key '%s' (first set on line %d)", key, doc->entries[i].line);
        }
    if (!rc && doc->n_sections + doc->n_entries >= TOML_MAX_ENTRIES)
        rc = toml_perr(ps, "too many sections and keys (at most %d)", TOML_MAX_ENTRIES);
    if (!rc && doc->n_entries == *cap) {
        int c = *cap ? 2 * *cap : 32;
        toml_entry_t *e = realloc(doc->entries, (size_t)c * sizeof(*e));
        if (!e)
            rc = toml_enomem(ps);
        else
            doc->entries = e, *cap = c;
    }
    if (rc) {
        free(key);
        toml_value_free(&v);
        return rc;
    }
    doc->entries[doc->n_entries++] =
        (toml_entry_t){.section = section, .key = key, .line = line, .value = v};
    return 0;
}

int toml_parse(toml_doc_t *doc, const char *text, size_t len, const char *path, char *err,
               size_t errlen)
{
    ps_t ps = {.p = text, .end = text + len, .line = 1, .path = path ? path : "<text>",
               .err = err, .errlen = errlen};
    memset(doc, 0, sizeof(*doc));
    int rc = toml_check_encoding(&ps), cap = 0;
    ps.line = 1;
    while (!rc) {
        toml_skip_ws(&ps);
        if (ps.p >= ps.end)
            break;
        const char *after = "the value";
        if (*ps.p == '[') {
            rc = header(&ps, doc);
            after = "the section header";
        } else if (*ps.p != '#' && *ps.p != '\n' && *ps.p != '\r') {
            rc = keyval(&ps, doc, &cap);
        }
        if (rc)
            break;
        toml_skip_ws(&ps);
        if (ps.p < ps.end && *ps.p == '#')
            rc = toml_skip_comment(&ps);
        if (rc || ps.p >= ps.end)
            break;
        char w[16];
        if (*ps.p == '\n' || *ps.p == '\r')
            rc = toml_eat_newline(&ps);
        else
            rc = toml_perr(&ps, "unexpected %s after %s", toml_what(&ps, w, sizeof(w)), after);
    }
    if (rc)
        toml_free(doc);
    return rc;
}

int toml_parse_value(toml_value_t *out, const char *text, size_t len, char *err, size_t errlen)
{
    ps_t ps = {.p = text, .end = text + len, .line = 1, .err = err, .errlen = errlen};
    memset(out, 0, sizeof(*out));
    char w[16];
    int rc = toml_check_encoding(&ps);
    if (rc)
        return rc;
    toml_skip_ws(&ps);
    if (toml_at_eol(&ps))
        return toml_perr(&ps, "expected a value, got %s", toml_what(&ps, w, sizeof(w)));
    rc = toml_value(&ps, out);
    if (!rc) {
        toml_skip_ws(&ps);
        if (ps.p < ps.end)
            rc = toml_perr(&ps, "unexpected %s after the value", toml_what(&ps, w, sizeof(w)));
    }
    if (rc)
        toml_value_free(out);
    return rc;
}

const char *toml_type_name(toml_type_t type)
{
    switch (type) {
    case TOML_STRING: return "a string";
    case TOML_INT: return "an integer";
    case TOML_FLOAT: return "a float";
    case TOML_BOOL: return "a boolean";
    case TOML_ARRAY: return "an array";
    }
    return "an unknown type";
}
