/* The work behind `ctitan prep`: read text files, train the BPE tokenizer, encode, and write
 * DIR/tokenizer.bin, DIR/train.bin and DIR/val.bin for the loader. A library so that tests can
 * run it directly; tools/cmd_prep.c only parses arguments and prints the summary. */
#ifndef CTITAN_PREP_H
#define CTITAN_PREP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PREP_FORTUNES_DIR "/usr/share/games/fortunes"
#define PREP_DEFAULT_OUT "data/fortunes"
#define PREP_DEFAULT_VOCAB 2048
#define PREP_DEFAULT_VAL_FRACTION 0.05

typedef struct {
    int vocab_size;
    const char *out_dir;
    double val_fraction;       /* the last this fraction of the tokens goes to val.bin; [0, 1) */
    const char *const *files;  /* text files to read, in order; none: the corpus dir below */
    size_t n_files;
    const char *corpus_dir;    /* default corpus (PREP_FORTUNES_DIR); tests point it elsewhere */
    const char *field;         /* JSON Lines inputs: the document's field (NULL: "text") */
    const char *tokenizer;     /* --tokenizer: encode with this one (tok_load), no training */
} prep_opts_t;

typedef struct {
    size_t n_files;
    size_t bytes_in;
    size_t n_tokens, n_train, n_val;
    int vocab_size;
    double entropy;            /* unigram entropy of all tokens, nats/token */
    double secs_read, secs_train, secs_encode, secs_write, secs_total;
    uint64_t bad_lines;        /* JSON Lines lines skipped (not JSON, no such field) */
} prep_result_t;

void prep_defaults(prep_opts_t *o);

/* Parses `prep [--vocab N] [--tokenizer PATH] [--out DIR] [--val-fraction F] [--field NAME] [--help] [--]
 * [FILE ...]`
 * (argv[0] is "prep"; "--opt=value" also works). o->files points into argv. Returns 0, 1 when
 * --help was given, or -EINVAL with a message naming the bad argument. */
int prep_parse_args(int argc, char **argv, prep_opts_t *o, char *err, size_t errlen);
void prep_usage(FILE *f);

/* The default corpus: regular files directly in dir, sorted by name, skipping *.dat, dot
 * files, symlinks (fortunes' *.u8) and folders (off/). *files is one malloc'ed block (free
 * it); errors say to install the `fortunes` package when dir is missing or empty. */
int prep_list_corpus(const char *dir, char ***files, size_t *n, char *err, size_t errlen);

/* Does the whole job. Each FILE is a file or a glob (stages/data/corpus.h), gzip-compressed or
 * not: JSON Lines (*.jsonl, *.ndjson, also .gz) give their documents each followed by "\n",
 * other files their text whole. On failure (0 > return, message in err naming the file or option)
 * nothing new is left in out_dir, and out_dir itself is removed if this call created it. */
int prep_run(const prep_opts_t *o, prep_result_t *res, char *err, size_t errlen);

#endif
