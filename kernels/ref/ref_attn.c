/* Double-precision references for rotary embedding and causal grouped-query attention. */
#include <math.h>
#include <string.h>

#include "kernels/ref/ref_ops.h"

void ref_rope_table(double *cos_t, double *sin_t, int T, int hd, double theta)
{
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double ang = t * pow(theta, -2.0 * i / hd);
            cos_t[t * half + i] = cos(ang);
            sin_t[t * half + i] = sin(ang);
        }
}

void ref_rope_table_freq(double *cos_t, double *sin_t, int T, int hd, const double *inv_freq)
{
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double ang = t * inv_freq[i];
            cos_t[t * half + i] = cos(ang);
            sin_t[t * half + i] = sin(ang);
        }
}

/* sign +1 rotates forward, -1 applies the inverse (transpose) rotation */
static void rotate(double *x, const double *c, const double *s, int B, int T, int H, int hd, int sign)
{
    int half = hd / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                double *v = x + (((size_t)b * T + t) * H + h) * hd;
                for (int i = 0; i < half; i++) {
                    double x1 = v[i], x2 = v[i + half], cs = c[t * half + i], sn = sign * s[t * half + i];
                    v[i] = x1 * cs - x2 * sn;
                    v[i + half] = x2 * cs + x1 * sn;
                }
            }
}

void ref_rope_fwd(double *x, const double *c, const double *s, int B, int T, int H, int hd)
{
    rotate(x, c, s, B, T, H, hd, 1);
}

void ref_rope_bwd(double *dx, const double *c, const double *s, int B, int T, int H, int hd)
{
    rotate(dx, c, s, B, T, H, hd, -1);
}

#define QROW(base, b, t, h, H) ((base) + (((size_t)(b) * T + (t)) * (H) + (h)) * hd)

void ref_attn_fwd(double *y, double *probs, const double *q, const double *k, const double *v, int B,
                  int T, int Hq, int Hkv, int hd)
{
    double scale = 1.0 / sqrt((double)hd);
    int group = Hq / Hkv;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < T; i++) {
                double *p = probs + (((size_t)b * Hq + h) * T + i) * T;
                const double *qi = QROW(q, b, i, h, Hq);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    p[j] = 0;
                    if (j > i)
                        continue;
                    const double *kj = QROW(k, b, j, h / group, Hkv);
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += qi[d] * kj[d];
                    p[j] = s * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= i; j++)
                    sum += p[j] = exp(p[j] - mx);
                double *yi = QROW(y, b, i, h, Hq);
                memset(yi, 0, hd * sizeof(double));
                for (int j = 0; j <= i; j++) {
                    p[j] /= sum;
                    const double *vj = QROW(v, b, j, h / group, Hkv);
                    for (int d = 0; d < hd; d++)
                        yi[d] += p[j] * vj[d];
                }
            }
}

void ref_attn_bwd(double *dq, double *dk, double *dv, const double *dy, const double *probs,
                  const double *q, const double *k, const double *v, int B, int T, int Hq, int Hkv,
                  int hd)
{
    double scale = 1.0 / sqrt((double)hd);
    int group = Hq / Hkv;
    memset(dq, 0, (size_t)B * T * Hq * hd * sizeof(double));
    memset(dk, 0, (size_t)B * T * Hkv * hd * sizeof(double));
    memset(dv, 0, (size_t)B * T * Hkv * hd * sizeof(double));
    double dp[T > 0 ? T : 1];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < T; i++) {
                const double *p = probs + (((size_t)b * Hq + h) * T + i) * T;
                const double *dyi = QROW(dy, b, i, h, Hq), *qi = QROW(q, b, i, h, Hq);
                double dot = 0;
                for (int j = 0; j <= i; j++) {
                    const double *vj = QROW(v, b, j, h / group, Hkv);
                    double *dvj = QROW(dv, b, j, h / group, Hkv);
                    dp[j] = 0;
                    for (int d = 0; d < hd; d++) {
                        dp[j] += dyi[d] * vj[d];
                        dvj[d] += p[j] * dyi[d];
                    }
                    dot += p[j] * dp[j];
                }
                double *dqi = QROW(dq, b, i, h, Hq);
                for (int j = 0; j <= i; j++) {
                    double ds = p[j] * (dp[j] - dot) * scale;
                    const double *kj = QROW(k, b, j, h / group, Hkv);
                    double *dkj = QROW(dk, b, j, h / group, Hkv);
                    for (int d = 0; d < hd; d++) {
                        dqi[d] += ds * kj[d];
                        dkj[d] += ds * qi[d];
                    }
                }
            }
}
