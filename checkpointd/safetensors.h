/* Export of a checkpoint's model weights as a safetensors file, the format Hugging Face
 * loaders read (https://github.com/huggingface/safetensors). `ctitan ckpt export` calls it;
 * the weights' names and layouts are already Hugging Face Llama's (kernels/params.h), so the
 * tensors go out as they are stored, without permutation or transposition.
 *
 * The file: an 8-byte little-endian header size N, N bytes of JSON (padded with spaces so
 * the data starts at a multiple of 8)
 *   {"__metadata__": {"format": "pt", "step": "N", "model.dim": "..", "manifest": ".."},
 *    "model.embed_tokens.weight": {"dtype": "F32", "shape": [V, D], "data_offsets": [0, 4VD]},
 *    ...}
 * then the tensors' bytes back to back in index order, offsets relative to the first byte
 * after the header. */
#ifndef CTITAN_SAFETENSORS_H
#define CTITAN_SAFETENSORS_H

#include <stddef.h>

/* Writes every tensor of the checkpoint at ckpt_path whose name does not start with
 * "optimizer." to out_path. Streams chunk by chunk (memory: one chunk), checking each chunk's
 * checksum as it goes (ckpt_read); the moments are not read, so a full check of the
 * checkpoint is ckpt_verify's job. Durable and atomic: written to a temporary file beside
 * out_path, fsynced, renamed over it, the directory fsynced; on failure nothing is left at
 * out_path (an existing file there stays as it was). Returns 0 or -errno with the reason
 * (naming the file, and the tensor where one is at fault) in err. */
int st_export(const char *ckpt_path, const char *out_path, char *err, size_t errlen);

#endif
