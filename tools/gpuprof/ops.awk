# The operation a GPU record belongs to, from its kind (kernel, memcpy, memset) and name: one
# word list for tools/gpu_breakdown.sh's tables and tools/gpuprof/waits.sh's (mawk and gawk).
function op_of(kind, name,   n) {
    if (kind == "memcpy") return "copy " name
    if (kind == "memset") return "memset"
    n = tolower(name)
    if (n ~ /attn_bwd|attn_delta/) return "attention backward"
    if (n ~ /attn_fwd/) return "attention forward"
    if (n ~ /flash|fmha|sdpa|cudnn.*attn/) return (n ~ /bwd|bprop|backward|dgrad|dot_do|convert_dq/) ? "attention backward" : "attention forward"
    if (n ~ /^triton/) return "Triton (torch.compile fused)"
    if (n ~ /adam|multi_tensor/) return "AdamW"
    if (n ~ /gemm|nvjet|xmma|cutlass|cublas|gemv|splitk/) return "matrix products (cuBLASLt)"
    if (n ~ /rmsnorm/) return "RMSNorm"
    if (n ~ /swiglu/) return "SwiGLU"
    if (n ~ /rope/) return "RoPE"
    if (n ~ /xent/) return "cross-entropy"
    if (n ~ /embed/) return "embedding"
    if (n ~ /nccl/) return "NCCL"
    if (n ~ /fill/) return "fills"
    return "other kernels"
}
