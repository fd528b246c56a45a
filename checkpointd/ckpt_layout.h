/* The checkpoint layout, in one place for every writer and reader: the names of a checkpoint
 * folder's directories (finished steps, a writer's temporary ones), and which data files a
 * checkpoint of the training state has, which array and which part each holds, what they and
 * their tensors are called. The arrays are the optimizer's (kernels/optim.h): array 0 the fp32
 * master weights ("model"), then its state arrays by their names (AdamW: the two moments).
 *
 *   DIR/step-NNNNNNNN/             a finished checkpoint of step N (8 digits, more when needed)
 *   DIR/.tmp-step-NNNNNNNN.PID/    one being written by process PID (or left by it)
 *   DIR/.tmp-probe.PID/            checkpointd's check that DIR is writable, at its start
 *     STEM.bin                     array a of the whole flat space (a checkpoint of one part)
 *     STEM.hK.bin                  array a of part K's ranges (a checkpoint in parts: one per
 *                                  host); files part-major, file K * arrays + a
 *     part-K.xxh                   part K's checksums while the parts are written
 *     index                        written last (ckpt.h)
 *
 * Tensors: array 0 under the parameters' own (Hugging Face) names, array a > 0 as
 * "optimizer.STATE.<name>", a master copy beside weights that are not fp32 as
 * "optimizer.master.<name>". */
#ifndef CTITAN_CKPT_LAYOUT_H
#define CTITAN_CKPT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/optim.h"

#define CKPT_TMP_PREFIX ".tmp-step-"

/* ---- directories ---- */

/* "DIR/step-NNNNNNNN". */
void ckpt_step_path(char *buf, size_t n, const char *dir, int64_t step);
/* The step a directory name "step-N" is for, or -1 when the name is not of that form. */
int64_t ckpt_step_of(const char *name);
/* ".tmp-step-NNNNNNNN.PID": the temporary directory process pid writes step's checkpoint in. */
void ckpt_tmp_name(char *buf, size_t n, int64_t step, int pid);
/* Whether name is a writer's temporary directory (".tmp-step-..."); then *step is its step (-1
 * when no digits follow the prefix) and *pid the number after the step's '.' (0 when none). */
int ckpt_tmp_of(const char *name, int64_t *step, long *pid);
/* Whether name is exactly ".tmp-step-NNNNNNNN.PID" for `step`, PID 1 to 10 digits without a
 * leading 0 and at most INT_MAX: the one form retention knows, and so a name that cannot point
 * outside the folder. Returns 0 or -EINVAL with err saying what was expected. */
int ckpt_tmp_check(const char *name, int64_t step, char *err, size_t errlen);
/* ".tmp-probe.PID" */
void ckpt_probe_name(char *buf, size_t n, int pid);
/* "part-K.xxh" */
void ckpt_part_sums_name(char *buf, size_t n, int part);

/* ---- data files and tensors ---- */

/* Data files of a checkpoint of o's state in n_parts parts (1: written whole). */
static inline int ckpt_files(const optim_t *o, int n_parts) { return optim_arrays(o) * n_parts; }
/* The file that holds array a of part k. */
static inline uint32_t ckpt_file_of(const optim_t *o, int k, int a) { return (uint32_t)(k * optim_arrays(o) + a); }
/* The part data file `file` of a checkpoint with n_files files in n_parts parts belongs to, and
 * the array it holds: from the counts alone, so a reader of any optimizer's checkpoint knows it. */
static inline int ckpt_part_of_file(uint32_t file, int n_files, int n_parts)
{
    return n_parts > 1 && n_files >= n_parts ? (int)(file / (uint32_t)(n_files / n_parts)) : 0;
}
/* "model.bin" / "STATE.h2.bin": file `file` of a checkpoint in n_parts parts. */
void ckpt_file_name(const optim_t *o, uint32_t file, int n_parts, char *buf, size_t n);
/* The part K a file's name "STEM.hK.bin" says it belongs to; -1 for a name of another form. */
int ckpt_file_name_part(const char *name);
/* The tensor of array a of parameter `param`: the name itself for a = 0, else
 * "optimizer.STATE.<param>". Returns buf. */
const char *ckpt_tensor_name(const optim_t *o, int a, const char *param, char *buf, size_t n);
/* "optimizer.master.<param>". Returns buf. */
const char *ckpt_master_tensor(const char *param, char *buf, size_t n);

#endif
