/* Causal GQA attention for the trainer, forward and backward, in C (see timbench/kernels/native.py).

   The same arithmetic, operation for operation, as numba_ops.attend (a row's query i against keys 0..i)
   and numba_grad.attend_causal_bwd; only the loops are arranged for SIMD. A score's j-ascending fp32 sum
   runs in a vector lane of its own (eight keys side by side, K transposed once per task), a dq/dk/dv
   element's sum over keys or queries likewise (vectors across j). Every lane is an IEEE operation, the
   exp is glibc's scalar `exp` (the symbol numba's math.exp calls), and gcc runs with -ffp-contract=off:
   the bits are numba's, on every ISA. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

typedef float f8 __attribute__((vector_size(32)));
typedef float f4 __attribute__((vector_size(16)));
typedef double d4 __attribute__((vector_size(32)));

#define INLINE static inline __attribute__((always_inline))
#define AVX2 __attribute__((target("avx2,fma")))
#define NOATTR
INLINE f8 ldf8(const float *p) { f8 v; memcpy(&v, p, sizeof v); return v; }
INLINE void stf8(float *p, f8 v) { memcpy(p, &v, sizeof v); }
INLINE d4 ldf4d(const float *p) { f4 v; memcpy(&v, p, sizeof v); return __builtin_convertvector(v, d4); }
INLINE d4 ldd4(const double *p) { d4 v; memcpy(&v, p, sizeof v); return v; }
INLINE void std4(double *p, d4 v) { memcpy(p, &v, sizeof v); }
INLINE f8 splatf(float s) { return (f8){s, s, s, s, s, s, s, s}; }
INLINE d4 splatd(double s) { return (d4){s, s, s, s}; }
/* dst[j * tp + t] = src[b, t, g, j] for t < nt: one kv head of one row, transposed so keys sit side by side. */
INLINE void kv_transpose(float *dst, const float *src, long b, long g, long nt, long nkv, long d, long tp) {
  for (long t = 0; t < nt; t++)
    for (long j = 0; j < d; j++) dst[j * tp + t] = src[((b * nt + t) * nkv + g) * d + j];
}

/* q, out: [B, T, H, D]; k, v: [B, T, Hkv, D]; probs: [B, T, H, T] (written when keep). */
#define FWD(NAME, ATTR)                                                                                     \
  ATTR static void NAME(const float *q, const float *k, const float *v, float *out, float *probs, long nb,  \
                        long nt, long nh, long nkv, long d, double scale, int keep, int threads) {           \
    long group = nh / nkv, tp = (nt + 7) / 8 * 8;                                                           \
    _Pragma("omp parallel num_threads(threads)")                                                            \
    {                                                                                                       \
      float *kt = calloc((size_t)d * tp, sizeof(float)), *acc = malloc(tp * sizeof(float));                 \
      float *sc = malloc(nt * sizeof(float));                                                               \
      _Pragma("omp for schedule(dynamic, 1)")                                                               \
      for (long task = 0; task < nb * nkv; task++) {                                                        \
        long b = task / nkv, g = task % nkv;                                                                \
        kv_transpose(kt, k, b, g, nt, nkv, d, tp);                                                          \
        for (long i = 0; i < nt; i++) {                                                                     \
          long tl = i + 1, tv = (tl + 7) / 8 * 8;                                                           \
          for (long hh = 0; hh < group; hh++) {                                                             \
            long h = g * group + hh;                                                                        \
            const float *qi = q + ((b * nt + i) * nh + h) * d;                                              \
            long t = 0;                          /* acc[t] = sum_j q[j] * k[t, j], j ascending, fp32 */     \
            for (; t + 32 <= tv; t += 32) {      /* four vectors of keys in flight: their chains overlap */ \
              f8 a0 = splatf(0.0f), a1 = a0, a2 = a0, a3 = a0;                                              \
              for (long j = 0; j < d; j++) {                                                                \
                f8 qj = splatf(qi[j]);                                                                      \
                const float *kr = kt + j * tp + t;                                                          \
                a0 = a0 + qj * ldf8(kr); a1 = a1 + qj * ldf8(kr + 8);                                       \
                a2 = a2 + qj * ldf8(kr + 16); a3 = a3 + qj * ldf8(kr + 24);                                 \
              }                                                                                             \
              stf8(acc + t, a0); stf8(acc + t + 8, a1); stf8(acc + t + 16, a2); stf8(acc + t + 24, a3);     \
            }                                                                                               \
            for (; t < tv; t += 8) {                                                                        \
              f8 a = splatf(0.0f);                                                                          \
              for (long j = 0; j < d; j++) a = a + splatf(qi[j]) * ldf8(kt + j * tp + t);                    \
              stf8(acc + t, a);                                                                             \
            }                                                                                               \
            double mx = -INFINITY;                                                                          \
            for (long t = 0; t < tl; t++) {                                                                 \
              double s = (double)acc[t] * scale;                                                            \
              sc[t] = (float)s;                                                                             \
              if (s > mx) mx = s;                                                                           \
            }                                                                                               \
            float tot = 0.0f;                                                                               \
            for (long t = 0; t < tl; t++) { float e = (float)exp((double)sc[t] - mx); sc[t] = e; tot += e; } \
            for (long t = 0; t < tl; t++) sc[t] = sc[t] / tot;                                              \
            if (keep) memcpy(probs + ((b * nt + i) * nh + h) * nt, sc, tl * sizeof(float));                 \
            float *o = out + ((b * nt + i) * nh + h) * d;                                                   \
            memset(o, 0, d * sizeof(float));                                                               \
            for (long t = 0; t < tl; t++) {      /* o[j] += p_t * v[t, j], t ascending, fp32 */             \
              const float *vt = v + ((b * nt + t) * nkv + g) * d;                                           \
              f8 p = splatf(sc[t]);                                                                         \
              long j = 0;                                                                                   \
              for (; j + 8 <= d; j += 8) stf8(o + j, ldf8(o + j) + p * ldf8(vt + j));                       \
              for (; j < d; j++) o[j] = o[j] + sc[t] * vt[j];                                               \
            }                                                                                               \
          }                                                                                                 \
        }                                                                                                   \
      }                                                                                                     \
      free(kt); free(acc); free(sc);                                                                        \
    }                                                                                                       \
  }

/* Gradients: dq, dout: [B, T, H, D]; dk, dv: [B, T, Hkv, D]; P, S: [B, T, H, T] (S: scratch). */
#define BWD(NAME, ATTR)                                                                                     \
  ATTR static void NAME(const float *q, const float *k, const float *v, const float *dout, const float *P,  \
                        float *S, float *dq, float *dk, float *dv, long nb, long nt, long nh, long nkv,     \
                        long d, double scale, int threads) {                                                \
    long group = nh / nkv, tp = (nt + 3) / 4 * 4;                                                           \
    _Pragma("omp parallel num_threads(threads)")                                                            \
    {                                                                                                       \
      float *vt = calloc((size_t)d * tp, sizeof(float));                                                    \
      double *dp = malloc(tp * sizeof(double)), *acc = malloc((d + 4) * sizeof(double));                    \
      double *ak = malloc((d + 4) * sizeof(double)), *av = malloc((d + 4) * sizeof(double));                \
      _Pragma("omp for schedule(dynamic, 1)")                                                               \
      for (long task = 0; task < nb * nkv; task++) {                                                        \
        long b = task / nkv, g = task % nkv;                                                                \
        kv_transpose(vt, v, b, g, nt, nkv, d, tp);                                                          \
        for (long i = 0; i < nt; i++) {                                                                     \
          long tl = i + 1, tv = (tl + 3) / 4 * 4;                                                           \
          for (long hh = 0; hh < group; hh++) {                                                             \
            long h = g * group + hh, row = (b * nt + i) * nh + h;                                           \
            const float *oi = dout + row * d, *pi = P + row * nt;                                           \
            float *si = S + row * nt;                                                                       \
            long t = 0;                          /* dp_t = sum_j dout_j v[t, j], j ascending, float64 */    \
            for (; t + 16 <= tv; t += 16) {      /* four vectors of keys in flight */                       \
              d4 a0 = splatd(0.0), a1 = a0, a2 = a0, a3 = a0;                                               \
              for (long j = 0; j < d; j++) {                                                                \
                d4 oj = splatd((double)oi[j]);                                                              \
                const float *vr = vt + j * tp + t;                                                          \
                a0 = a0 + oj * ldf4d(vr); a1 = a1 + oj * ldf4d(vr + 4);                                     \
                a2 = a2 + oj * ldf4d(vr + 8); a3 = a3 + oj * ldf4d(vr + 12);                                \
              }                                                                                             \
              std4(dp + t, a0); std4(dp + t + 4, a1); std4(dp + t + 8, a2); std4(dp + t + 12, a3);          \
            }                                                                                               \
            for (; t < tv; t += 4) {                                                                        \
              d4 a = splatd(0.0);                                                                           \
              for (long j = 0; j < d; j++) a = a + splatd((double)oi[j]) * ldf4d(vt + j * tp + t);           \
              std4(dp + t, a);                                                                              \
            }                                                                                               \
            double c = 0.0;                                                                                 \
            for (long t = 0; t < tl; t++) c += (double)pi[t] * dp[t];                                       \
            for (long t = 0; t < tl; t++) si[t] = (float)((double)pi[t] * (dp[t] - c));                     \
            long j = 0;                          /* dq_j = sum_t ds_t k[t, j], t ascending, float64 */      \
            for (; j + 16 <= d; j += 16) {       /* sixteen j's in four registers over all t */             \
              d4 a0 = splatd(0.0), a1 = a0, a2 = a0, a3 = a0;                                               \
              for (long t = 0; t < tl; t++) {                                                               \
                d4 s4 = splatd((double)si[t]);                                                              \
                const float *kr = k + ((b * nt + t) * nkv + g) * d + j;                                     \
                a0 = a0 + s4 * ldf4d(kr); a1 = a1 + s4 * ldf4d(kr + 4);                                     \
                a2 = a2 + s4 * ldf4d(kr + 8); a3 = a3 + s4 * ldf4d(kr + 12);                                \
              }                                                                                             \
              std4(acc + j, a0); std4(acc + j + 4, a1); std4(acc + j + 8, a2); std4(acc + j + 12, a3);      \
            }                                                                                               \
            for (; j < d; j++) {                                                                            \
              double a = 0.0;                                                                               \
              for (long t = 0; t < tl; t++) a = a + (double)si[t] * (double)k[((b * nt + t) * nkv + g) * d + j]; \
              acc[j] = a;                                                                                   \
            }                                                                                               \
            for (j = 0; j < d; j++) dq[row * d + j] = (float)(acc[j] * scale);                              \
          }                                                                                                 \
        }                                                                                                   \
        for (long t = 0; t < nt; t++) {          /* dk_t, dv_t: queries i >= t ascending, heads ascending */ \
          long j = 0;                                                                                       \
          for (; j + 16 <= d; j += 16) {         /* sixteen j's of dk and of dv in eight registers */       \
            d4 k0 = splatd(0.0), k1 = k0, k2 = k0, k3 = k0, v0 = k0, v1 = k0, v2 = k0, v3 = k0;             \
            for (long i = t; i < nt; i++)                                                                   \
              for (long hh = 0; hh < group; hh++) {                                                         \
                long row = (b * nt + i) * nh + g * group + hh;                                              \
                d4 s4 = splatd((double)S[row * nt + t]), p4 = splatd((double)P[row * nt + t]);              \
                const float *qi = q + row * d + j, *oi = dout + row * d + j;                                \
                k0 = k0 + s4 * ldf4d(qi); k1 = k1 + s4 * ldf4d(qi + 4);                                     \
                k2 = k2 + s4 * ldf4d(qi + 8); k3 = k3 + s4 * ldf4d(qi + 12);                                \
                v0 = v0 + p4 * ldf4d(oi); v1 = v1 + p4 * ldf4d(oi + 4);                                     \
                v2 = v2 + p4 * ldf4d(oi + 8); v3 = v3 + p4 * ldf4d(oi + 12);                                \
              }                                                                                             \
            std4(ak + j, k0); std4(ak + j + 4, k1); std4(ak + j + 8, k2); std4(ak + j + 12, k3);            \
            std4(av + j, v0); std4(av + j + 4, v1); std4(av + j + 8, v2); std4(av + j + 12, v3);            \
          }                                                                                                 \
          for (; j < d; j++) {                                                                              \
            double a = 0.0, e = 0.0;                                                                        \
            for (long i = t; i < nt; i++)                                                                   \
              for (long hh = 0; hh < group; hh++) {                                                         \
                long row = (b * nt + i) * nh + g * group + hh;                                              \
                a = a + (double)S[row * nt + t] * (double)q[row * d + j];                                   \
                e = e + (double)P[row * nt + t] * (double)dout[row * d + j];                                \
              }                                                                                             \
            ak[j] = a; av[j] = e;                                                                           \
          }                                                                                                 \
          long base = ((b * nt + t) * nkv + g) * d;                                                         \
          for (j = 0; j < d; j++) { dk[base + j] = (float)(ak[j] * scale); dv[base + j] = (float)av[j]; }   \
        }                                                                                                   \
      }                                                                                                     \
      free(vt); free(dp); free(acc); free(ak); free(av);                                                    \
    }                                                                                                       \
  }

FWD(fwd_generic, NOATTR)
FWD(fwd_avx2, AVX2)
BWD(bwd_generic, NOATTR)
BWD(bwd_avx2, AVX2)

void timbench_attend_causal(const float *q, const float *k, const float *v, float *out, float *probs, long nb,
                            long nt, long nh, long nkv, long d, double scale, int keep, int isa, int threads) {
  (isa ? fwd_avx2 : fwd_generic)(q, k, v, out, probs, nb, nt, nh, nkv, d, scale, keep, threads);
}

void timbench_attend_causal_bwd(const float *q, const float *k, const float *v, const float *dout,
                                const float *P, float *S, float *dq, float *dk, float *dv, long nb, long nt,
                                long nh, long nkv, long d, double scale, int isa, int threads) {
  (isa ? bwd_avx2 : bwd_generic)(q, k, v, dout, P, S, dq, dk, dv, nb, nt, nh, nkv, d, scale, threads);
}
