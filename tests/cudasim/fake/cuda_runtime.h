/* Stand-in for <cuda_runtime.h>: the CPU emulator (tests/cudasim/sim.h). */
#include "../sim.h"
