"""The distribution transformers samples from: temperature, top-k and top-p logits warpers in
the order generate() applies them, then softmax (tests/test_generate.c compares
gen_distribution with it).

usage: hf_warpers.py LOGITS.f32 TEMPERATURE TOP_K TOP_P [TEMPERATURE TOP_K TOP_P ...]
  LOGITS.f32  the logits of one position: little-endian float32, back to back
For each setting, one line per token of nonzero probability (its id and probability, %.9g),
then a line "--"."""
import sys

import numpy as np
import torch
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)


def main():
    logits = torch.from_numpy(np.fromfile(sys.argv[1], dtype="<f4").copy())[None]
    args = sys.argv[2:]
    for at in range(0, len(args), 3):
        temperature, top_k, top_p = float(args[at]), int(args[at + 1]), float(args[at + 2])
        warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
        if top_k > 0:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1:
            warpers.append(TopPLogitsWarper(top_p))
        probs = torch.softmax(warpers(None, logits), dim=-1)[0]
        for i in torch.nonzero(probs).flatten().tolist():
            print(i, "%.9g" % float(probs[i]))
        print("--")


if __name__ == "__main__":
    main()
