/* The checkpoint layout's names (see ckpt_layout.h). */
#include "checkpointd/ckpt_layout.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"

void ckpt_step_path(char *buf, size_t n, const char *dir, int64_t step)
{
    snprintf(buf, n, "%s/step-%08" PRId64, dir, step);
}

/* The number of the digits at s (at least one, no overflow); -1 otherwise. *end: after them. */
static int64_t digits(const char *s, const char **end)
{
    int64_t v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    *end = p;
    return p > s ? v : -1;
}

int64_t ckpt_step_of(const char *name)
{
    const char *end;
    if (strncmp(name, "step-", 5))
        return -1;
    int64_t v = digits(name + 5, &end);
    return v >= 0 && !*end ? v : -1;
}

void ckpt_tmp_name(char *buf, size_t n, int64_t step, int pid)
{
    snprintf(buf, n, CKPT_TMP_PREFIX "%08" PRId64 ".%d", step, pid);
}

int ckpt_tmp_of(const char *name, int64_t *step, long *pid)
{
    const size_t k = strlen(CKPT_TMP_PREFIX);
    const char *end;
    *step = -1;
    *pid = 0;
    if (strncmp(name, CKPT_TMP_PREFIX, k))
        return 0;
    *step = digits(name + k, &end);
    if (*step >= 0 && *end == '.') /* the writer's pid; anything else after the step is still a leftover */
        *pid = strtol(end + 1, NULL, 10);
    return 1;
}

int ckpt_tmp_check(const char *name, int64_t step, char *err, size_t errlen)
{
    char want[48];
    size_t n = (size_t)snprintf(want, sizeof(want), CKPT_TMP_PREFIX "%08" PRId64 ".", step), k = strnlen(name, 64);
    int ok = k > n && k - n <= 10 && !strncmp(name, want, n) && name[n] != '0';
    for (size_t i = n; ok && i < k; i++)
        ok = name[i] >= '0' && name[i] <= '9';
    if (!ok || strtoll(name + n, NULL, 10) > INT_MAX)
        return util_fail(err, errlen, -EINVAL, "'%.64s' is not the name of a temporary directory of step %" PRId64
                         " (%sPID, PID that of the committing checkpointd)", name, step, want);
    return 0;
}

void ckpt_probe_name(char *buf, size_t n, int pid) { snprintf(buf, n, ".tmp-probe.%d", pid); }

void ckpt_part_sums_name(char *buf, size_t n, int part) { snprintf(buf, n, "part-%d.xxh", part); }

/* Array a's stem: "model" for the master weights, else the optimizer's name of the state. */
static const char *stem(const optim_t *o, int a) { return a == 0 ? "model" : o->state[a - 1]; }

void ckpt_file_name(const optim_t *o, uint32_t file, int n_parts, char *buf, size_t n)
{
    int arrays = optim_arrays(o), k = (int)file / arrays, a = (int)file % arrays;
    if (n_parts > 1)
        snprintf(buf, n, "%s.h%d.bin", stem(o, a), k);
    else
        snprintf(buf, n, "%s.bin", stem(o, a));
}

int ckpt_file_name_part(const char *name)
{
    const char *h = strrchr(name, '.'), *end = NULL;
    if (!h || strcmp(h, ".bin"))
        return -1;
    const char *k = h;
    while (k > name && k[-1] >= '0' && k[-1] <= '9')
        k--;
    if (k - name < 2 || k[-1] != 'h' || k[-2] != '.')
        return -1;
    int64_t v = digits(k, &end);
    return end == h && v <= INT32_MAX ? (int)v : -1;
}

const char *ckpt_tensor_name(const optim_t *o, int a, const char *param, char *buf, size_t n)
{
    if (a == 0)
        snprintf(buf, n, "%s", param);
    else
        snprintf(buf, n, "optimizer.%s.%s", o->state[a - 1], param);
    return buf;
}

const char *ckpt_master_tensor(const char *param, char *buf, size_t n)
{
    snprintf(buf, n, "optimizer.master.%s", param);
    return buf;
}
