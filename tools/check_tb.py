#!/usr/bin/env python3
"""Checks a folder of ctitan's TensorBoard event files ([metrics] enable_tensorboard) against the
run's metrics file, reading the folder with TensorBoard's own EventAccumulator, as
`tensorboard --logdir` does; tests/test_tb runs it.

    tools/check_tb.py TB_FOLDER METRICS_JSONL

What TensorBoard shows must be the metrics file's numbers: one scalar tag per number of a step
record (its key; mem_peak_bytes as mem_peak_gib; stage_ms's rows as stage_ms/S/f, /b, /w; a
null as what not_finite names), val_loss at its step, each tag at exactly the steps the records
have, and each value the record's to the digits it was printed with and float precision (a
simple_value is a float). A relaunched run's records redo steps: the later record counts, as
TensorBoard keeps the later file's events. Prints a summary; exits 1 at the first difference,
2 on bad usage, 3 when the tensorboard package cannot be imported."""
import json
import math
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError as e:
    print(f"check_tb: cannot import tensorboard ({e}): pip install tensorboard", file=sys.stderr)
    sys.exit(3)

FLOAT_EPS = 2.0 ** -24  # a float's relative rounding


class Number:
    """A metrics-file number and the half unit of its last printed digit."""

    def __init__(self, text):
        self.value = float(text)
        mant, _, exp = text.lower().partition("e")
        digits = len(mant.partition(".")[2])
        self.half_unit = 0.5 * 10.0 ** (int(exp or 0) - digits)


def expected(path):
    """{tag: {step: (value, tolerance)}} from the metrics file; later records win."""
    want = {}
    for n, line in enumerate(open(path), 1):
        rec = json.loads(line, parse_float=Number, parse_int=Number)
        if "restart" in rec:
            continue
        step = int(rec["step"].value)
        not_finite = rec.get("not_finite", {})
        for key, v in rec.items():
            if key in ("step", "not_finite", "val_batches", "val_tokens"):
                continue
            if key == "stage_ms":
                for s, row in enumerate(v):
                    for c, x in zip("fbw", row):
                        want.setdefault(f"stage_ms/{s}/{c}", {})[step] = (x.value, x.half_unit)
                continue
            if v is None:
                if key not in not_finite:
                    raise SystemExit(f"check_tb: {path}:{n}: {key} is null and not_finite does not name it")
                want.setdefault(key, {})[step] = (float(not_finite[key]), 0.0)
                continue
            if key == "mem_peak_bytes":
                key, val, tol = "mem_peak_gib", v.value / 2**30, v.half_unit / 2**30
            else:
                val, tol = v.value, v.half_unit
            want.setdefault(key, {})[step] = (val, tol)
    return want


def same(got, val, tol):
    if math.isnan(val) or math.isinf(val):
        return (math.isnan(val) and math.isnan(got)) or got == val
    return abs(got - val) <= tol + abs(val) * FLOAT_EPS


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    folder, metrics = sys.argv[1], sys.argv[2]
    want = expected(metrics)
    acc = event_accumulator.EventAccumulator(folder, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = sorted(acc.Tags()[event_accumulator.SCALARS])
    if tags != sorted(want):
        print(f"check_tb: TensorBoard has the tags {tags}, the metrics file {sorted(want)}")
        return 1
    values = 0
    for tag in tags:
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        steps = sorted(want[tag])
        if [s for s, _ in got] != steps:
            print(f"check_tb: {tag}: TensorBoard has steps {[s for s, _ in got]}, the metrics file {steps}")
            return 1
        for step, value in got:
            val, tol = want[tag][step]
            if not same(value, val, tol):
                print(f"check_tb: {tag} at step {step}: TensorBoard has {value!r}, the metrics file {val!r}")
                return 1
            values += 1
    print(f"check_tb: {len(tags)} tags, {values} values, as the metrics file has them "
          f"(file_version {acc.file_version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
