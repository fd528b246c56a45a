#!/usr/bin/env python3
"""Two Hugging Face Llama folders hold the same model (tests/test_finetune.c: import, then export).

  hf_same.py A B

Both are loaded by LlamaForCausalLM.from_pretrained with torch_dtype="auto" (each in the dtype it
was saved in); every weight of B must equal A's bit for bit, in the same dtype, and B's
config.json must give the same shape. A's tied lm_head (tie_word_embeddings) is A's embedding,
which B, exported untied, must hold as its own lm_head.weight. Prints one line; exit status 1
with the first difference.
"""
import json
import os
import sys

import torch
from transformers import LlamaForCausalLM
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()
SHAPE = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "rms_norm_eps", "rope_theta", "rope_scaling", "vocab_size", "max_position_embeddings"]


def main():
    a_dir, b_dir = sys.argv[1], sys.argv[2]
    ca = json.load(open(os.path.join(a_dir, "config.json")))
    cb = json.load(open(os.path.join(b_dir, "config.json")))
    for k in SHAPE:
        va, vb = ca.get(k), cb.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            va = {x: va[x] for x in va if x != "type"}
            vb = {x: vb[x] for x in vb if x != "type"}
        if va != vb:
            sys.exit(f"hf_same: config.json {k}: {va!r} in {a_dir}, {vb!r} in {b_dir}")
    if cb.get("tie_word_embeddings"):
        sys.exit("hf_same: the export ties its embeddings; ctitan exports them untied")
    a = LlamaForCausalLM.from_pretrained(a_dir, torch_dtype="auto").state_dict()
    b = LlamaForCausalLM.from_pretrained(b_dir, torch_dtype="auto").state_dict()
    if ca.get("tie_word_embeddings"):
        a["lm_head.weight"] = a["model.embed_tokens.weight"]
    if sorted(a) != sorted(b):
        sys.exit(f"hf_same: tensors differ: {sorted(set(a) ^ set(b))}")
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape:
            sys.exit(f"hf_same: {k}: {a[k].dtype} {tuple(a[k].shape)} vs {b[k].dtype} {tuple(b[k].shape)}")
        if not torch.equal(a[k].view(torch.int16 if a[k].element_size() == 2 else torch.int32),
                           b[k].view(torch.int16 if b[k].element_size() == 2 else torch.int32)):
            sys.exit(f"hf_same: {k} differs")
    print(f"hf_same: {len(a)} tensors bit for bit, dtype {next(iter(b.values())).dtype}")


if __name__ == "__main__":
    main()
