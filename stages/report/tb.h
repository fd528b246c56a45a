/* TensorBoard event files (issue 14, `[metrics] enable_tensorboard`): the coordinator's
 * scalars of each step, beside the metrics file's JSON lines, in the files TensorBoard reads
 * (`tensorboard --logdir DIR`). A file is TFRecord framing around Event protocol buffers
 * (stages/report/tb_event.proto: TensorFlow's field numbers), one Event per scalar. */
#ifndef CTITAN_TB_H
#define CTITAN_TB_H

#include <stddef.h>
#include <stdint.h>

/* The name's first part and the first record's file_version, as TensorFlow's writers have them. */
#define TB_FILE_PREFIX "events.out.tfevents."
#define TB_FILE_VERSION "brain.Event:2"

typedef struct tb tb_t;

/* Creates dir (mkdir -p) and a new event file in it,
 * DIR/events.out.tfevents.<unix time>.<hostname>.<pid>.0 (the last number counts up while the
 * name is taken), and writes its first records through to the file: the file_version, then a
 * SessionLog START at first_step, the first step the run will write. Every open makes a new
 * file: TensorBoard reads all of a folder's files, in name order (so the name sorts after
 * every event file of the folder: an open in the same second as the newest waits up to a
 * second for the next), and at a START drops what it has read from that step on, so a
 * relaunched or resumed run's steps replace those its failed run had written. Returns 0 and
 * the writer in *out (the caller's: tb_close), or -errno with "DIR: ..." or "FILE: ..." and
 * the reason in err. */
int tb_open(tb_t **out, const char *dir, int64_t first_step, char *err, size_t errlen);

/* The event file's path. */
const char *tb_path(const tb_t *tb);

/* Seconds since the epoch, the clock of Event.wall_time. */
double tb_now(void);

/* One Event { wall_time, step, summary { value { tag, simple_value } } }: value as a float,
 * NaN and infinities as they are (TensorBoard plots them as such). Buffered until tb_flush.
 * Returns 0 or -ENOMEM; a failure is also the next tb_flush's, so a caller may check only that. */
int tb_scalar(tb_t *tb, const char *tag, int64_t step, double value, double wall_time);

/* Writes the buffered records to the file in one write: once per step, so a coordinator that
 * dies loses at most the step it was in. Returns 0, or -errno with "FILE: ..." and the reason
 * in err (then or at an earlier tb_scalar); the file may then end in a torn record, which
 * TensorBoard's reader stops at. */
int tb_flush(tb_t *tb, char *err, size_t errlen);

/* Closes the file (what was not flushed is dropped) and frees *tb; sets *tb = NULL. */
void tb_close(tb_t **tb);

#endif
