/* Stand-in for <mma.h>: the CPU emulator (tests/cudasim/sim.h). */
#include "../sim.h"
