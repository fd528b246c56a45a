/* Picks a backend table (backend.h) by the manifest's device name: the CPU's is built in, the
 * CUDA one is the plugin's (cuda_plugin.h), loaded only when asked for. */
#include "kernels/backend.h"

#include <stdio.h>
#include <string.h>

#include "kernels/cuda_plugin.h"

const backend_t *backend_load(const char *device, char *err, size_t errlen)
{
    if (!strcmp(device, "cpu"))
        return backend_cpu();
    if (strcmp(device, "cuda")) {
        snprintf(err, errlen, "device \"%s\": expected \"cpu\" or \"cuda\"", device);
        return NULL;
    }
    const cuda_plugin_t *cu = cuda_plugin_load(err, errlen);
    return cu ? &cu->backend : NULL;
}
