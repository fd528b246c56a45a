/* Loads the CUDA plugin (cuda_plugin.h). */
#include "kernels/cuda_plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const cuda_plugin_t *cuda_plugin_load(char *err, size_t errlen)
{
    char exe[PATH_MAX], path[PATH_MAX + 64];
    const char *other = getenv(CUDA_PLUGIN_ENV);
    if (other && other[0]) {
        snprintf(path, sizeof(path), "%s", other);
    } else {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0) {
            snprintf(err, errlen, "cannot find my own executable (/proc/self/exe)");
            return NULL;
        }
        exe[n] = 0;
        *strrchr(exe, '/') = 0;
        snprintf(path, sizeof(path), "%s/../lib/libctitan_cuda.so", exe);
    }
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* kept open: the table lives in it */
    if (!so) {
        snprintf(err, errlen, "cannot load the CUDA backend %s: %s (ctitan builds it only where nvcc exists)", path,
                 dlerror());
        return NULL;
    }
    const cuda_plugin_t *(*get)(void);
    *(void **)&get = dlsym(so, "ctitan_cuda_plugin");
    const cuda_plugin_t *t = get ? get() : NULL;
    if (!t || t->version != CUDA_PLUGIN_VERSION) {
        if (!t)
            snprintf(err, errlen, "%s: no ctitan_cuda_plugin table (rebuild it with `make`)", path);
        else
            snprintf(err, errlen, "%s: a CUDA backend of table version %d, this program's is %d (rebuild it with "
                     "`make`)", path, t->version, CUDA_PLUGIN_VERSION);
        dlclose(so);
        return NULL;
    }
    return t;
}
