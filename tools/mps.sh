# NVIDIA's Multi-Process Service for one command's processes, sourced by the GPU scripts
# (tools/gpu_breakdown.sh, tools/bench_gpu.sh): a private control daemon (`nvidia-cuda-mps-control
# -d`, no root needed) with pipe and log folders of its own under DIR, which the processes started
# after mps_start find through CUDA_MPS_PIPE_DIRECTORY. Without it a job's processes on one GPU
# are time-sliced, never running kernels at the same time; with it they share the GPU at once.
#
#   mps_start DIR   # 0, or 1 with a line on stderr (no MPS here); exports the two variables
#   mps_stop        # the daemon quits (and its server with it); the variables go

mps_start() {
    mkdir -p "$1/mps-pipe" "$1/mps-log"
    export CUDA_MPS_PIPE_DIRECTORY=$1/mps-pipe CUDA_MPS_LOG_DIRECTORY=$1/mps-log
    if ! nvidia-cuda-mps-control -d; then
        echo "mps: nvidia-cuda-mps-control -d failed" >&2
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        return 1
    fi
}

mps_stop() {
    [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
    sleep 1 # the daemon's server leaves the GPU
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
