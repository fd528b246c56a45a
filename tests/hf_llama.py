#!/usr/bin/env python3
"""A random small Llama written by transformers, for tests/test_hf_import.c.

  hf_llama.py OUT [--dtype float32|bfloat16|float16] [--tied] [--rope-llama3] [--shard]
                  [--hidden 32 --layers 2 --heads 4 --kv-heads 2 --inter 64 --vocab 96 --max-pos 64]
                  [--batch 2 --seq 12 --seed 0]

writes OUT/ with save_pretrained (config.json, model.safetensors or shards with
model.safetensors.index.json), OUT/tokens.i32 (batch*seq int32 token ids) and OUT/logits.f32
(batch*seq*vocab float32: the logits of the model as saved, read back in fp32, on the CPU,
eager attention) and OUT/loss.txt (the mean cross-entropy of predicting tokens[1:] from
tokens[:-1] for each row, the loss ctitan's first training step reports on such rows).

  hf_llama.py --loss HF_DIR TOKENS.i32 ROWS

prints that mean cross-entropy for ROWS rows of int32 tokens (each row: inputs and, shifted by
one, targets) under the model of HF_DIR read in fp32.

  hf_llama.py --generate HF_DIR PROMPT_IDS N

prints the N token ids that transformers' greedy generate (from_pretrained in fp32, eager
attention, no EOS) puts after PROMPT_IDS (ids separated by spaces) on one line, then on a second
what it puts there stopping at the end-of-text ids of the folder's generation config (fewer when
one comes) (tests/test_generate.c compares `ctitan generate HF_DIR` with both).
"""
import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def loss_of(hf, tokens_path, rows):
    import numpy as np
    model = LlamaForCausalLM.from_pretrained(hf, torch_dtype=torch.float32, attn_implementation="eager").eval()
    t = torch.from_numpy(np.fromfile(tokens_path, dtype=np.int32).astype(np.int64)).view(rows, -1)
    with torch.no_grad():
        logits = model(t[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1))
    print("%.9g" % loss.item())


def generate(hf, prompt, n):
    model = LlamaForCausalLM.from_pretrained(hf, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([[int(t) for t in prompt.split()]])
    for kw in ({"eos_token_id": None}, {}):  # then the folder's generation_config.json's
        with torch.no_grad():
            # synced_gpus given: its default imports torch.distributed.fsdp, which Debian's torch
            # 1.13 cannot import under Python 3.11
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                 num_beams=1, pad_token_id=0, synced_gpus=False, **kw)
        print(" ".join(str(int(t)) for t in out[0, ids.shape[1]:]))


def main():
    import sys
    if len(sys.argv) == 5 and sys.argv[1] == "--loss":
        return loss_of(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    if len(sys.argv) == 5 and sys.argv[1] == "--generate":
        return generate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--rope-llama3", action="store_true")
    ap.add_argument("--shard", action="store_true")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--inter", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=96)
    ap.add_argument("--max-pos", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rope = None
    if a.rope_llama3:  # original 16 with head_dim 8..: every band of the scaling is used
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}
    cfg = LlamaConfig(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, intermediate_size=a.inter, vocab_size=a.vocab,
                      max_position_embeddings=a.max_pos, rms_norm_eps=1e-5, rope_theta=10000.0,
                      rope_scaling=rope, tie_word_embeddings=a.tied, initializer_range=0.2,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so that a misplaced one shows
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    dtype = getattr(torch, a.dtype)
    model.to(dtype).save_pretrained(a.out, safe_serialization=True,
                                    max_shard_size="20KB" if a.shard else "10GB")
    back = LlamaForCausalLM.from_pretrained(a.out, torch_dtype=torch.float32, attn_implementation="eager").eval()
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), dtype=torch.int32)
    with torch.no_grad():
        logits = back(tokens.long()).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, a.vocab), tokens[:, 1:].reshape(-1).long())
    tokens.numpy().tofile(os.path.join(a.out, "tokens.i32"))
    logits.contiguous().numpy().tofile(os.path.join(a.out, "logits.f32"))
    with open(os.path.join(a.out, "loss.txt"), "w") as f:
        f.write("%.9g\n" % loss.item())


if __name__ == "__main__":
    main()
