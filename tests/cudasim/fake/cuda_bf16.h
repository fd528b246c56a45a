/* Stand-in for <cuda_bf16.h>: the CPU emulator (tests/cudasim/sim.h). */
#include "../sim.h"
