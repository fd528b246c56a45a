"""Greedy generation with transformers' LlamaForCausalLM on weights exported by `ctitan ckpt
export --safetensors` (tests/test_generate.c compares `ctitan generate` with it).

usage: hf_generate.py WEIGHTS.safetensors CONFIG_JSON PROMPT_IDS N
  CONFIG_JSON  LlamaConfig keyword arguments as JSON (the checkpoint's model shape)
  PROMPT_IDS   token ids separated by spaces
Prints the N new token ids, space-separated, on one line."""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    path, config, prompt, n = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    torch.manual_seed(0)
    scaling = config.get("rope_scaling")
    for k in ("factor", "low_freq_factor", "high_freq_factor"):
        if scaling and k in scaling:
            scaling[k] = float(scaling[k])
    cfg = LlamaConfig(**config, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, torch_dtype="float32")
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).float().eval()
    state = load_file(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        sys.exit(f"weights do not match the config: missing {missing}, unexpected {unexpected}")
    ids = torch.tensor([[int(t) for t in prompt.split()]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=None,
                             # synced_gpus given: its default imports torch.distributed.fsdp, which
                             # Debian's torch 1.13 cannot import under Python 3.11
                             synced_gpus=False)
    print(" ".join(str(int(t)) for t in out[0, ids.shape[1]:]))


if __name__ == "__main__":
    main()
