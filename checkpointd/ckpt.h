/* The checkpoint format: what a checkpoint of step N is on disk, and how it is read back.
 * Written by checkpointd (checkpointd/writer.h), read by checkpointd on resume (into the
 * staging segment: checkpointd/restore.h) and by `ctitan ckpt`. Its names (directories,
 * files, tensors) are checkpointd/ckpt_layout.h's.
 *
 *   DIR/step-NNNNNNNN/        one complete checkpoint (steps completed = N); it only ever
 *                             appears by rename from DIR/.tmp-step-NNNNNNNN.PID once every
 *                             file in it is written and synced, the index last
 *     model.bin, STATE.bin    data files, one per array of the training state (the fp32
 *                             master weights, then the optimizer's state arrays, each over
 *                             the flat space in the order of kernels/params.h): a 4 KiB header
 *                             (magic "CTCKDAT1", version, step), then the flat fp32 array
 *     index                   magic "CTCKIDX1", version, msgpack body, XXH64 of all before
 *
 * A checkpoint written in parts (one part per host of a job across hosts, each host writing
 * the ranges of the flat space its optimizer shards own: ckpt_index_plan_parts) has instead
 * one data file per array and part K, model.hK.bin, STATE.hK.bin: the same header, then part
 * K's ranges back to back in flat order. Its index is an ordinary one (a
 * tensor's chunks point into the file of the part that owns them), so every reader reads it
 * as it reads any checkpoint, on any number of hosts. While it is written each part leaves
 * part-K.xxh in the temporary directory (ckpt_part_sums_t: the XXH3 of each of its chunks),
 * from which the host that commits writes the index; the committed directory has none.
 *
 * The index names every tensor (name, dtype, global shape) and where each chunk of it lives
 * (file, offset, length, XXH3-64 of the bytes); chunks are at most CKPT_CHUNK_BYTES. It also
 * holds the step, the loader cursor at the start of the next step, and the manifest (TOML)
 * of the run that wrote it; with the seed in that manifest that is all the state a run
 * needs to continue bit for bit (the lr schedule and AdamW's bias correction are functions
 * of the step; data shuffling is a function of seed and cursor).
 *
 * Tensor names: weights under their Hugging Face Llama names ("model.embed_tokens.weight",
 * "lm_head.weight"), the optimizer's state as "optimizer.STATE.<name>" (ckpt_layout.h).
 * On the CPU backend the weights are the fp32 master weights; a backend whose weights are
 * not fp32 adds "optimizer.master.<name>" (ckpt_master_name says which to read).
 *
 * Every reader checks what it reads: the index by its own checksum and structure (names,
 * ranges inside the files, chunks covering each tensor exactly), data by chunk checksums,
 * each data file's header against the index (ckpt_data_header_read).
 * Functions return 0 or -errno and say why in err; nothing here exits. */
#ifndef CTITAN_CKPT_H
#define CTITAN_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "checkpointd/ckpt_layout.h"
#include "kernels/params.h"

#define CKPT_INDEX_MAGIC "CTCKIDX1"
#define CKPT_DATA_MAGIC "CTCKDAT1"
#define CKPT_VERSION 1u
#define CKPT_DATA_HDR 4096              /* bytes of a data file's header */
#define CKPT_CHUNK_BYTES (4u << 20)     /* largest checksummed chunk */
#define CKPT_NAME_MAX 128               /* tensor names */
#define CKPT_FILE_MAX 64                /* data file names */
#define CKPT_MAX_DIMS 4
#define CKPT_CURSOR_MAX 240             /* = LDR_CURSOR_MAX */
#define CKPT_INDEX_MAX (256u << 20)     /* an index larger than this is refused */
#define CKPT_STEP_MAX INT32_MAX         /* training.steps is an int: no run completes more steps */
#define CKPT_FILES_MAX 4096             /* data files of one checkpoint */
#define CKPT_PARTS_MAX 1365             /* parts of one checkpoint: AdamW's 3 files each, in CKPT_FILES_MAX */
#define CKPT_SUMS_MAGIC "CTCKSUM1"      /* a part's checksum file */

typedef struct {
    uint32_t file;        /* index into files */
    uint64_t offset;      /* bytes into the file */
    uint64_t length;      /* bytes: a whole number of elements */
    uint64_t xxh;         /* XXH3_64bits of those bytes */
} ckpt_chunk_t;

typedef struct {
    char name[CKPT_NAME_MAX];
    char dtype[8];        /* "F32" (safetensors spelling); "BF16" reserved for the CUDA backend */
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    uint64_t numel;
    uint32_t n_chunks;    /* in element order, contiguous, together exactly numel elements */
    ckpt_chunk_t *chunks;
} ckpt_tensor_t;

typedef struct {
    char name[CKPT_FILE_MAX]; /* ckpt_safe_name */
    uint64_t bytes;       /* its size on disk */
} ckpt_file_t;

typedef struct {
    int64_t step;         /* steps completed: training resumes at step + 1 (1-based) */
    int64_t created;      /* Unix time */
    char *manifest;       /* resolved TOML of the run that wrote it (owned) */
    uint32_t cursor_len;  /* the loader cursor at the start of the next step */
    uint8_t cursor[CKPT_CURSOR_MAX];
    int n_files;
    ckpt_file_t *files;   /* owned */
    int n_tensors;
    ckpt_tensor_t *tensors; /* owned, chunks too */
} ckpt_index_t;

/* Whether s may name a file inside a checkpoint: 1..63 characters of A-Z a-z 0-9 . _ -,
 * not starting with '.'. The decoder checks every file name of an index with it (and so does
 * the remote server for job names) before anything becomes a path; the encoder does not. */
int ckpt_safe_name(const char *s);
size_t ckpt_dtype_size(const char *dtype); /* 0 when unknown */
/* "[2048, 64]": a shape for messages, in buf (returned). */
const char *ckpt_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* The training state's index for a model and optimizer o: one file per array (ckpt_layout.h),
 * each CKPT_DATA_HDR + total*4 bytes, and per array and parameter a tensor (array-major) with
 * chunk offsets filled in and checksums 0 (the writer takes them from the bytes it writes). */
int ckpt_index_plan(ckpt_index_t *ix, const param_table_t *tab, const optim_t *o, int64_t step, const char *manifest,
                    const void *cursor, size_t cursor_len);
/* A range [begin, end) of the flat space (in floats) and the part that writes it. */
typedef struct {
    uint64_t begin, end;
    int part;
} ckpt_part_range_t;
/* The index of a checkpoint written in n_parts parts, ranges saying which part owns what (in
 * order, tiling [0, tab->total) exactly; -EINVAL otherwise). n_parts == 1 is ckpt_index_plan's
 * plan exactly. n_parts > 1: arrays x n_parts files, part-major (ckpt_file_of: array a of part
 * K, "model.hK.bin" etc.), CKPT_DATA_HDR + 4 * (floats K owns) bytes (a part that owns nothing
 * has its files, header only). Every tensor's chunks are in element order, at most
 * CKPT_CHUNK_BYTES, split where the owning part changes, each in its owner's file. Checksums 0,
 * as ckpt_index_plan's. */
int ckpt_index_plan_parts(ckpt_index_t *ix, const param_table_t *tab, const optim_t *o, int64_t step,
                          const char *manifest, const void *cursor, size_t cursor_len, int n_parts,
                          const ckpt_part_range_t *ranges, int n_ranges);

/* A part's checksum file, "part-K.xxh" in the temporary directory (checkpointd/writer.h):
 *   magic "CTCKSUM1", version (uint32), 4 zero bytes, step (int64), part (uint32), n_parts
 *   (uint32), count (uint64), count XXH3-64s, XXH64 of everything before it; native-endian.
 * The checksums are those of the part's chunks in plan order: tensor by tensor, each tensor's
 * chunks in order, only the chunks that lie in the part's files. */
typedef struct {
    int64_t step;
    uint32_t part, n_parts;
    uint64_t count;
    uint64_t *xxh;        /* count checksums (owned) */
} ckpt_part_sums_t;
size_t ckpt_part_sums_bytes(uint64_t count);              /* the file's size for count checksums */
int ckpt_part_sums_encode(const ckpt_part_sums_t *ps, uint8_t **buf, size_t *len); /* caller frees */
/* Decodes and checks the bytes of a part's checksum file (`what` names it in errors): the
 * magic, the version, the zero bytes, the step (0..CKPT_STEP_MAX), part < n_parts <=
 * CKPT_PARTS_MAX, count against the length, the trailing XXH64. Returns 0 or -EBADMSG with
 * "WHAT: bad part checksum file: ..." in err (-ENOMEM). Never reads past len. */
int ckpt_part_sums_decode(const void *buf, size_t len, ckpt_part_sums_t *ps, const char *what, char *err,
                          size_t errlen);
void ckpt_part_sums_free(ckpt_part_sums_t *ps);

/* Fills every chunk checksum of file `file` from its payload: `data` holds the file's bytes
 * from offset CKPT_DATA_HDR on. A plan with checksums makes the writer check the bytes against
 * them instead of filling them in (the tests use this; checkpointd leaves it to the writer). */
void ckpt_index_hash(ckpt_index_t *ix, uint32_t file, const void *data);
/* The 4 KiB header block of a data file: magic, version (uint32), the file's number in the
 * index (uint32), the step (int64), all native-endian, then zeros. */
void ckpt_data_header(void *block, uint32_t file, int64_t step);
/* Parses and checks the first CKPT_DATA_HDR bytes of buf (len bytes): the magic, the version,
 * a step >= 0, and zeros in every byte after the step, so that any damage to the header shows
 * (no chunk checksum covers it). Returns 0 with *file and *step, or -EBADMSG with the reason in
 * err ("header: ...", without the file's name). Never reads past len. Readers compare *file
 * and *step with the index: a data file whose chunks all start at or past CKPT_DATA_HDR (every
 * file of ckpt_index_plan) must begin with this header. */
int ckpt_data_header_read(const void *buf, size_t len, uint32_t *file, int64_t *step, char *err, size_t errlen);

int ckpt_index_encode(const ckpt_index_t *ix, uint8_t **buf, size_t *len); /* caller frees */
/* Decodes and checks an index (`what` names it in errors, e.g. its path). */
int ckpt_index_decode(const void *buf, size_t len, ckpt_index_t *ix, const char *what, char *err, size_t errlen);
void ckpt_index_free(ckpt_index_t *ix);
/* Tensor by name, or NULL. */
const ckpt_tensor_t *ckpt_index_find(const ckpt_index_t *ix, const char *name);

/* ---- reading a checkpoint directory ---- */

typedef struct ckpt ckpt_t;

/* Opens DIR/step-N (or any directory holding an index): reads and checks the index (in a
 * directory named step-N, its step must be N); data files are opened when first read.
 * -ENOENT: no index (an incomplete checkpoint); -EBADMSG: a bad one. */
int ckpt_open(ckpt_t **out, const char *path, char *err, size_t errlen);
void ckpt_close(ckpt_t **c);
const ckpt_index_t *ckpt_index(const ckpt_t *c);
const char *ckpt_path(const ckpt_t *c);
/* Elements [first, first + n) of a tensor into dst, checking the checksum of every chunk
 * read. -ENOENT: no such tensor; -EBADMSG: corrupt or truncated (err names tensor and file). */
int ckpt_read(ckpt_t *c, const char *tensor, uint64_t first, uint64_t n, void *dst, char *err, size_t errlen);
/* Name of the fp32 master copy of weight `name`: "optimizer.master.<name>" when present,
 * else `name` itself. */
const char *ckpt_master_name(const ckpt_t *c, const char *name, char *buf, size_t n);

/* Reads every chunk of every tensor and checks it. Each problem is one line on `report`
 * (may be NULL) naming the tensor, the file and what is wrong (missing, truncated, checksum
 * mismatch, bad index); *n_bad counts them. Returns 0 when all is well, -EBADMSG when a
 * problem was found, -ENOENT when there is no index (incomplete) or no such directory (err
 * says which), other -errno for I/O. */
int ckpt_verify(const char *path, FILE *report, int *n_bad, char *err, size_t errlen);
/* ckpt_verify without reading the chunks: the index, and every data file there, regular, of
 * the index's size, with its header. What a reader that checks each chunk as it reads it
 * (ckpt_read) needs first, at the cost of the index and the headers, not of the data. */
int ckpt_check_files(const char *path, FILE *report, int *n_bad, char *err, size_t errlen);

/* Complete checkpoints of DIR (step-N directories, real ones: a link is not a checkpoint;
 * temporary ones ignored), steps ascending
 * (caller frees *steps). Returns how many, or -errno. A missing DIR has none. */
int ckpt_list(const char *dir, int64_t **steps);
/* The newest checkpoint of DIR that verifies. Each newer one that does not is reported on
 * `log` ("DIR/step-N: <why>: not loading it") before falling back. -ENOENT when DIR has no
 * checkpoint at all; -EBADMSG when it has some but none verifies. */
int ckpt_find_latest(const char *dir, char *path, size_t n, FILE *log, char *err, size_t errlen);
/* What ckpt_find_loading loads from a checkpoint directory: 0 when it did; else -errno with
 * the reason in err, and *corrupt = 1 when what failed was the data (a chunk's checksum, a file
 * cut short: the checkpoint is passed over for an older one); any other failure ends the search. */
typedef int (*ckpt_load_fn)(void *arg, const char *path, int *corrupt, char *err, size_t errlen);
/* The newest checkpoint of DIR whose files are all there (ckpt_check_files) and that `load`
 * loads, checking each chunk as it reads it: the data read once, not verified and then loaded.
 * Each newer one passed over is reported on `log` with why. -ENOENT only when DIR has no
 * checkpoint at all; -EBADMSG when none loads, or when a load ended the search with -ENOENT;
 * else the error a load ended it with. */
int ckpt_find_loading(const char *dir, ckpt_load_fn load, void *arg, char *path, size_t n, FILE *log, char *err,
                      size_t errlen);

/* Moves checkpoint directory `path` (one found damaged) aside to PATH.damaged, or
 * PATH.damaged.2 ... when that is taken, kept (no loader takes those names) and out of the
 * way of a run that would write that step again. 0 with the new name in aside, or -errno. */
int ckpt_set_aside(const char *path, char *aside, size_t n);
/* Removes complete checkpoints of DIR beyond the newest `keep` (keep <= 0: keeps all), and
 * temporary directories whose writer (the PID in the name) is gone. Returns how many
 * checkpoints it removed, or -errno. */
int ckpt_retain(const char *dir, int keep);
/* rm -rf of a directory of plain files (a checkpoint); refuses anything deeper, and a path
 * whose last component is a link (-ELOOP: neither the link nor what it names is touched). */
int ckpt_remove_dir(const char *path);

#endif
