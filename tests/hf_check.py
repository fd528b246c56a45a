#!/usr/bin/env python3
"""Loads a folder of `ctitan ckpt export --hf` the way a user would and checks it (test_hf_export).

  hf_check.py DIR --ref REF.safetensors [--dtype float32|bfloat16] [--tokens T.i32 --logits L.f32]
              [--text X.bin --ids I.i32] [--shards N]

LlamaForCausalLM.from_pretrained(DIR) (with torch_dtype=bfloat16 for --dtype bfloat16, else no
arguments): every weight equals REF's (the checkpoint's weights as `--safetensors` exports them;
for bfloat16, REF's rounded by torch) bit for bit; with --tokens the logits of transformers on
those tokens (int32, one row) equal ctitan's (--logits, float32 [T, vocab]) to 1e-5;
with --text, AutoTokenizer.from_pretrained(DIR) encodes the UTF-8 text X as ctitan did (--ids)
and decodes it back. --shards: the number of model-*.safetensors the folder must hold.
Prints one line of figures; exit status 1 with the reason when a check fails.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaForCausalLM
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()


def fail(msg):
    print("hf_check: " + msg)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--ref", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens")
    ap.add_argument("--logits")
    ap.add_argument("--text")
    ap.add_argument("--ids")
    ap.add_argument("--shards", type=int)
    ap.add_argument("--max-shard-size", type=int)
    a = ap.parse_args()
    figures = []
    if a.shards is not None:
        n = len(glob.glob(os.path.join(a.dir, "model-*-of-*.safetensors")))
        if n != a.shards:
            fail("%d shards, expected %d" % (n, a.shards))
        figures.append("shards=%d" % n)
    if a.dtype == "bfloat16":
        model = LlamaForCausalLM.from_pretrained(a.dir, torch_dtype=torch.bfloat16)
    else:
        model = LlamaForCausalLM.from_pretrained(a.dir)
    model.eval()
    ref = load_file(a.ref)
    sd = model.state_dict()
    if set(sd) != set(ref):
        fail("weights differ in names: %s" % sorted(set(sd) ^ set(ref)))
    want = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    for name, r in ref.items():
        w = sd[name]
        if w.dtype != want or not torch.equal(w, r.to(want)):
            fail("weight %s differs (%s)" % (name, w.dtype))
    figures.append("weights=%d equal" % len(ref))
    if a.max_shard_size:
        from huggingface_hub import split_torch_state_dict_into_shards
        split = split_torch_state_dict_into_shards(sd, max_shard_size=a.max_shard_size)
        index = json.load(open(os.path.join(a.dir, "model.safetensors.index.json")))
        if index["weight_map"] != split.tensor_to_filename:
            fail("shards differ from transformers': %s vs %s" % (index["weight_map"], split.tensor_to_filename))
        if index["metadata"]["total_size"] != split.metadata["total_size"]:
            fail("total_size %s, transformers says %s" % (index["metadata"], split.metadata))
        figures.append("shards as transformers'")
    if a.tokens:
        tok = torch.from_numpy(np.fromfile(a.tokens, dtype=np.int32).astype(np.int64))[None, :]
        with torch.no_grad():
            out = model(tok).logits[0].float()
        mine = torch.from_numpy(np.fromfile(a.logits, dtype=np.float32)).reshape(out.shape)
        diff = (out - mine).abs().max().item()
        figures.append("logits_max_diff=%.3g" % diff)
        if not diff <= 1e-5:
            fail("logits differ by %g" % diff)
    if a.text:
        t = AutoTokenizer.from_pretrained(a.dir)
        text = open(a.text, "rb").read().decode("utf-8")
        ids = t.encode(text)
        want_ids = np.fromfile(a.ids, dtype=np.int32).tolist()
        if ids != want_ids:
            k = next((i for i in range(min(len(ids), len(want_ids))) if ids[i] != want_ids[i]), None)
            fail("tokens differ from ctitan's at %s: %s vs %s" % (k, ids[k:k + 5] if k is not None else ids[-5:],
                                                                  want_ids[k:k + 5] if k is not None else want_ids[-5:]))
        if t.decode(ids) != text:
            fail("decode(encode(text)) != text")
        figures.append("tokens=%d equal" % len(ids))
        cfg = json.load(open(os.path.join(a.dir, "config.json")))
        figures.append("vocab=%d" % cfg["vocab_size"])
    print("hf_check: ok: " + ", ".join(figures))


if __name__ == "__main__":
    main()
