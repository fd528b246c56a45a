/* `ctitan prep`: train the tokenizer on a text corpus and write the token shards the loader
 * reads. Argument parsing and the work live in stages/data/prep.c; this prints the summary. */
#include <math.h>
#include <stdio.h>

#include "tools/cmds.h"
#include "stages/data/prep.h"

int cmd_prep(int argc, char **argv)
{
    prep_opts_t o;
    char err[1024];
    int rc = prep_parse_args(argc, argv, &o, err, sizeof(err));
    if (rc == 1) {
        prep_usage(stdout);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "ctitan prep: %s\n\n", err);
        prep_usage(stderr);
        return 2;
    }
    prep_result_t r;
    if ((rc = prep_run(&o, &r, err, sizeof(err)))) {
        fprintf(stderr, "ctitan prep: %s\n", err);
        return 1;
    }
    printf("prep: %zu file(s), %zu bytes -> %zu tokens (%.2f bytes/token), vocab %d\n",
           r.n_files, r.bytes_in, r.n_tokens, (double)r.bytes_in / (double)r.n_tokens,
           r.vocab_size);
    if (r.bad_lines)
        printf("prep: %llu bad JSON Lines line(s) skipped\n", (unsigned long long)r.bad_lines);
    printf("prep: unigram entropy %.4f nats/token (uniform over the vocab: %.4f)\n", r.entropy,
           log((double)r.vocab_size));
    printf("prep: wrote %s/{tokenizer.bin, train.bin (%zu tokens), val.bin (%zu tokens)}\n",
           o.out_dir, r.n_train, r.n_val);
    printf("prep: %.2f s (read %.2f, train %.2f, encode %.2f, write %.2f)\n", r.secs_total,
           r.secs_read, r.secs_train, r.secs_encode, r.secs_write);
    return 0;
}
