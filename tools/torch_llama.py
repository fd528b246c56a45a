#!/usr/bin/env python3
"""A plain PyTorch Llama with ctitan's conventions, the yardstick ctitan is measured against.

Same model as kernels/cpu/model.c: token embedding, per layer RMSNorm -> causal grouped-query
attention with Hugging Face rotate-half rotary embedding -> residual, RMSNorm -> SwiGLU
(gate_proj, up_proj, down_proj) -> residual; final RMSNorm, untied lm_head, mean
cross-entropy. Parameters carry the Hugging Face Llama names, so the weights of
`ctitan ckpt export --safetensors` load into it by name.

  torch_llama.py check --weights W.safetensors --tokens T.i32 --batch B --seq S
      loss and gradient norm of one batch (int32 tokens, B*(S+1) of them: inputs and
      targets are the same rows shifted by one), in fp32 on the CPU, as JSON. tests/
      test_torch_ref compares them with ctitan's CPU model on the same weights.
  torch_llama.py bench --dim D --n-layers L --n-heads H --n-kv-heads K --vocab V --seq S
                       --batch B [--steps N] [--no-compile]
      training tokens/s (forward, backward, AdamW) with bf16 autocast on CUDA and
      torch.compile where the installed PyTorch has it, as JSON (for `make bench-gpu`).

Only PyTorch and the Python standard library are needed (the safetensors package is not).
"""
import argparse
import json
import math
import struct
import sys
import time

import torch
import torch.nn.functional as F


class Config:
    def __init__(self, dim, n_layers, n_heads, n_kv_heads, vocab_size, hidden, norm_eps=1e-5,
                 rope_theta=10000.0):
        self.dim, self.n_layers, self.n_heads = dim, n_layers, n_heads
        self.n_kv_heads, self.vocab_size, self.hidden = n_kv_heads, vocab_size, hidden
        self.norm_eps, self.rope_theta = norm_eps, rope_theta
        self.head_dim = dim // n_heads


def ffn_hidden(dim, multiple_of, ffn_dim_multiplier=0.0):
    """config_ffn_hidden of kernels/config.c (torchtitan's rule)."""
    h = 4 * dim
    h = 2 * h // 3
    if ffn_dim_multiplier > 0:
        h = int(ffn_dim_multiplier * h)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(T, hd, theta, device):
    half = hd // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64, device=device) / hd)
    ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()          # [T, half]


def rope(x, cos, sin):
    """Rotate-half: pairs (i, i + hd/2). x [B, T, H, hd]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class Llama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        D, hd = cfg.dim, cfg.head_dim
        p = lambda *shape: torch.nn.Parameter(torch.empty(*shape))
        self.params = torch.nn.ParameterDict()
        self.names = {}
        def add(name, t):
            key = name.replace(".", "__")          # ParameterDict keys may not hold dots
            self.params[key] = t
            self.names[name] = key
        add("model.embed_tokens.weight", p(cfg.vocab_size, D))
        for l in range(cfg.n_layers):
            pre = "model.layers.%d." % l
            add(pre + "input_layernorm.weight", p(D))
            add(pre + "self_attn.q_proj.weight", p(cfg.n_heads * hd, D))
            add(pre + "self_attn.k_proj.weight", p(cfg.n_kv_heads * hd, D))
            add(pre + "self_attn.v_proj.weight", p(cfg.n_kv_heads * hd, D))
            add(pre + "self_attn.o_proj.weight", p(D, cfg.n_heads * hd))
            add(pre + "post_attention_layernorm.weight", p(D))
            add(pre + "mlp.gate_proj.weight", p(cfg.hidden, D))
            add(pre + "mlp.up_proj.weight", p(cfg.hidden, D))
            add(pre + "mlp.down_proj.weight", p(D, cfg.hidden))
        add("model.norm.weight", p(D))
        add("lm_head.weight", p(cfg.vocab_size, D))

    def w(self, name):
        return self.params[self.names[name]]

    def init_random(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, key in self.names.items():
                t = self.params[key]
                if name.endswith("norm.weight"):
                    t.fill_(1.0)
                else:
                    t.copy_(torch.randn(t.shape, generator=g) * (1.0 if "embed" in name else 0.02))

    def forward(self, tokens, targets):
        cfg = self.cfg
        B, T = tokens.shape
        H, K, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        cos, sin = rope_tables(T, hd, cfg.rope_theta, tokens.device)
        x = F.embedding(tokens, self.w("model.embed_tokens.weight"))
        for l in range(cfg.n_layers):
            pre = "model.layers.%d." % l
            h = rms_norm(x, self.w(pre + "input_layernorm.weight"), cfg.norm_eps)
            q = (h @ self.w(pre + "self_attn.q_proj.weight").t()).view(B, T, H, hd)
            k = (h @ self.w(pre + "self_attn.k_proj.weight").t()).view(B, T, K, hd)
            v = (h @ self.w(pre + "self_attn.v_proj.weight").t()).view(B, T, K, hd)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))        # [B, heads, T, hd]
            if K != H:                                               # query head h uses kv head h // (H/K)
                k = k.repeat_interleave(H // K, dim=1)
                v = v.repeat_interleave(H // K, dim=1)
            if hasattr(F, "scaled_dot_product_attention"):
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:                                                    # PyTorch < 2.0
                s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
                mask = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)
                a = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
            a = a.transpose(1, 2).reshape(B, T, H * hd)
            x = x + a @ self.w(pre + "self_attn.o_proj.weight").t()
            h = rms_norm(x, self.w(pre + "post_attention_layernorm.weight"), cfg.norm_eps)
            m = F.silu(h @ self.w(pre + "mlp.gate_proj.weight").t()) * (h @ self.w(pre + "mlp.up_proj.weight").t())
            x = x + m @ self.w(pre + "mlp.down_proj.weight").t()
        x = rms_norm(x, self.w("model.norm.weight"), cfg.norm_eps)
        logits = x @ self.w("lm_head.weight").t()
        return F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T))


def read_safetensors(path):
    """(tensors by name, metadata) with the standard library and torch only."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b:base + e]), dtype=dtypes[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out, meta


def config_from(weights, meta, args):
    D = weights["model.embed_tokens.weight"].shape[1]
    V = weights["model.embed_tokens.weight"].shape[0]
    L = 1 + max(int(k.split(".")[2]) for k in weights if k.startswith("model.layers."))
    hidden = weights["model.layers.0.mlp.gate_proj.weight"].shape[0]
    H = args.n_heads or int(meta.get("model.n_heads", 0))
    if not H:
        sys.exit("torch_llama: the number of heads is neither in the file's metadata nor given (--n-heads)")
    hd = D // H
    K = weights["model.layers.0.self_attn.k_proj.weight"].shape[0] // hd
    eps = args.eps if args.eps is not None else float(meta.get("model.norm_eps", 1e-5))
    theta = args.theta if args.theta is not None else float(meta.get("model.rope_theta", 10000.0))
    return Config(D, L, H, K, V, hidden, eps, theta)


def cmd_check(args):
    weights, meta = read_safetensors(args.weights)
    cfg = config_from(weights, meta, args)
    model = Llama(cfg)
    with torch.no_grad():
        for name, key in model.names.items():
            if name not in weights:
                sys.exit("torch_llama: %s has no tensor %s" % (args.weights, name))
            if tuple(weights[name].shape) != tuple(model.params[key].shape):
                sys.exit("torch_llama: %s: shape %s, expected %s" % (name, tuple(weights[name].shape),
                                                                     tuple(model.params[key].shape)))
            model.params[key].copy_(weights[name].float())
    with open(args.tokens, "rb") as f:
        raw = f.read()
    need = args.batch * (args.seq + 1)
    if len(raw) != 4 * need:
        sys.exit("torch_llama: %s has %d bytes, expected %d int32 tokens" % (args.tokens, len(raw), need))
    tok = torch.tensor(struct.unpack("<%di" % need, raw), dtype=torch.long).view(args.batch, args.seq + 1)
    loss = model(tok[:, :-1], tok[:, 1:])
    loss.backward()
    sq = sum(float(p.grad.double().pow(2).sum()) for p in model.params.values())
    print(json.dumps({"loss": float(loss), "grad_norm": math.sqrt(sq), "torch": torch.__version__}))


def cmd_bench(args):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = Config(args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.vocab,
                 ffn_hidden(args.dim, args.multiple_of, args.ffn_dim_multiplier), 1e-5, 500000.0)
    model = Llama(cfg)
    model.init_random()
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev == "cuda") if dev == "cuda" else torch.optim.AdamW(model.parameters())
    compiled = False
    fwd = model
    if not args.no_compile and hasattr(torch, "compile"):
        fwd = torch.compile(model)
        compiled = True
    tok = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), device=dev)

    def step():
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            loss = fwd(tok[:, :-1], tok[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(3):                       # compile and warm up
        step()
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if dev == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    peak = torch.cuda.max_memory_allocated() if dev == "cuda" else 0
    # the device's memory in use, as ctitan's figure counts it (its context and the caching
    # allocator's reserve included; the allocator keeps the step's peak reserved)
    used = (lambda f, t: t - f)(*torch.cuda.mem_get_info()) if dev == "cuda" else 0
    print(json.dumps({"device": dev, "compiled": compiled, "torch": torch.__version__,
                      "tokens_per_s": args.batch * args.seq / dt, "step_ms": dt * 1e3,
                      "peak_bytes": peak, "device_bytes": used, "loss": float(loss.detach())}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--weights", required=True)
    c.add_argument("--tokens", required=True)
    c.add_argument("--batch", type=int, required=True)
    c.add_argument("--seq", type=int, required=True)
    c.add_argument("--n-heads", type=int, default=0)
    c.add_argument("--eps", type=float, default=None)
    c.add_argument("--theta", type=float, default=None)
    b = sub.add_parser("bench")
    for k, d in (("dim", 256), ("n-layers", 6), ("n-heads", 16), ("n-kv-heads", 16), ("vocab", 2048),
                 ("seq", 256), ("batch", 8), ("steps", 10), ("multiple-of", 256)):
        b.add_argument("--" + k, type=int, default=d)
    b.add_argument("--ffn-dim-multiplier", type=float, default=0.0)
    b.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    (cmd_check if args.cmd == "check" else cmd_bench)(args)


if __name__ == "__main__":
    main()
