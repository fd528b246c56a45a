/* Reading safetensors files (https://github.com/huggingface/safetensors) as Hugging Face
 * writes a model: one DIR/model.safetensors, or shards named by DIR/model.safetensors.index.json's
 * weight_map. The import (checkpointd/hf_import.h) reads a Llama through it; the export is
 * checkpointd/safetensors.h. Each file: an 8-byte little-endian header size N, N bytes of JSON
 * {"__metadata__": {str: str}, NAME: {"dtype", "shape", "data_offsets": [begin, end]}, ...},
 * then the data, offsets relative to its first byte. Everything is checked before a byte of
 * data is believed: the header's size and JSON, each dtype, each shape against its offsets,
 * offsets inside the file, no two tensors overlapping. Returns 0 or -errno, the file (and
 * tensor, key) at fault in err; nothing exits. */
#ifndef CTITAN_ST_READ_H
#define CTITAN_ST_READ_H

#include <stddef.h>
#include <stdint.h>

#define ST_HEADER_MAX (100u << 20) /* safetensors' own bound on a header */
#define ST_NAME_MAX 256
#define ST_MAX_DIMS 8

typedef struct {
    char name[ST_NAME_MAX];
    char dtype[12];       /* "F32", "BF16", "I64", ... (any dtype safetensors knows) */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t offset;      /* of its first byte in its file */
    uint64_t bytes;
    int file;             /* index into st_set_t.files */
} st_tensor_t;

/* The size of one element of a safetensors dtype, 0 for a name it does not have. */
size_t st_dtype_size(const char *dtype);

/* Parses a file's header from its first `avail` bytes (the whole header must be there) for a
 * file of file_size bytes: the size prefix, the JSON, every tensor. *out (caller frees) gets
 * *n tensors, in header order, offsets absolute, file 0. `what` names the file in errors.
 * -EBADMSG for anything wrong, -ENOMEM. */
int st_parse(const void *buf, size_t avail, uint64_t file_size, const char *what, st_tensor_t **out, int *n,
             char *err, size_t errlen);

/* A model's tensors over its files. */
typedef struct {
    int n_files;
    char **files;         /* paths (owned) */
    int n;
    st_tensor_t *t;       /* owned; every name once */
} st_set_t;

/* Opens DIR's model.safetensors.index.json (shards: each file of weight_map must exist and
 * hold exactly the tensors the map gives it) or, without one, DIR/model.safetensors.
 * -ENOENT when neither is there or a shard is missing (naming it). */
int st_set_open(st_set_t *s, const char *dir, char *err, size_t errlen);
void st_set_close(st_set_t *s);
const st_tensor_t *st_set_find(const st_set_t *s, const char *name);
/* Tensor t's elements as fp32 into dst (t->numel floats): F32 as it is (bit for bit), BF16
 * and F16 widened exactly; any other dtype -ENOTSUP naming the tensor. -EIO for a file that
 * changed under it. */
int st_set_read_f32(const st_set_t *s, const st_tensor_t *t, float *dst, char *err, size_t errlen);

#endif
