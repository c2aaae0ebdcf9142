/* Causal GQA attention for the trainer, forward and backward, in C (see timbench/kernels/native.py).

   The same arithmetic, operation for operation, as numba_ops.attend (a row's query i against keys 0..i)
   and numba_grad.attend_causal_bwd; only the loops are arranged for SIMD. A score's j-ascending fp32 sum
   runs in a vector lane of its own (8 or 16 keys side by side, K transposed once per task), a dq/dk/dv
   element's sum over keys or queries likewise (vectors across j). Every lane is an IEEE operation, the
   exp is glibc's scalar `exp` (the symbol numba's math.exp calls), and gcc runs with -ffp-contract=off:
   the bits are numba's, on every ISA. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

typedef float f8 __attribute__((vector_size(32)));
typedef float f16 __attribute__((vector_size(64)));
typedef float f4 __attribute__((vector_size(16)));
typedef double d4 __attribute__((vector_size(32)));
typedef double d8 __attribute__((vector_size(64)));

#define INLINE static inline __attribute__((always_inline))
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2,fma")))
#define NOATTR
/* Each build instantiates FWD and BWD with its float vector VF and double vector VD (f8/d4 for AVX2 and, as two
   SSE2 vectors each, for SSE2; f16/d8 for AVX-512); these helpers take the type as an argument. The AVX-512 ones
   are intrinsics: under target("avx512f") gcc 12 builds a 512-bit vector initializer lane by lane (a masked
   broadcast per lane) and widens 8 floats in two halves. */
#define LDV(T, p) ({ T v_; memcpy(&v_, (p), sizeof v_); v_; })
#define STV(p, v) ({ __typeof__(v) v_ = (v); memcpy((p), &v_, sizeof v_); })
#define SPLAT(T, s) _Generic((T *)0, f8 *: splat_f8, d4 *: splat_d4, f16 *: splat_f16, d8 *: splat_d8)(s)
#define LDFD(T, p) _Generic((T *)0, d4 *: ldfd_d4, d8 *: ldfd_d8)(p)  /* floats at p widened to doubles */
INLINE f8 splat_f8(float s) { return (f8){s, s, s, s, s, s, s, s}; }
INLINE d4 splat_d4(double s) { return (d4){s, s, s, s}; }
INLINE d4 ldfd_d4(const float *p) { f4 v; memcpy(&v, p, sizeof v); return __builtin_convertvector(v, d4); }
AVX512 INLINE f16 splat_f16(float s) { return (f16)_mm512_set1_ps(s); }
AVX512 INLINE d8 splat_d8(double s) { return (d8)_mm512_set1_pd(s); }
AVX512 INLINE d8 ldfd_d8(const float *p) { return (d8)_mm512_cvtps_pd(_mm256_loadu_ps(p)); }
/* dst[j * tp + t] = src[b, t, g, j] for t < nt: one kv head of one row, transposed so keys sit side by side. */
INLINE void kv_transpose(float *dst, const float *src, long b, long g, long nt, long nkv, long d, long tp) {
  for (long t = 0; t < nt; t++)
    for (long j = 0; j < d; j++) dst[j * tp + t] = src[((b * nt + t) * nkv + g) * d + j];
}

/* q, out: [B, T, H, D]; k, v: [B, T, Hkv, D]; probs: [B, T, H, T] (written when keep). */
#define FWD(NAME, ATTR, VF)                                                                                 \
  ATTR static void NAME(const float *q, const float *k, const float *v, float *out, float *probs, long nb,  \
                        long nt, long nh, long nkv, long d, double scale, int keep, int threads) {           \
    enum { L = sizeof(VF) / sizeof(float) };                                                                \
    long group = nh / nkv, tp = (nt + L - 1) / L * L;                                                       \
    _Pragma("omp parallel num_threads(threads)")                                                            \
    {                                                                                                       \
      float *kt = calloc((size_t)d * tp, sizeof(float)), *acc = malloc(tp * sizeof(float));                 \
      float *sc = malloc(nt * sizeof(float));                                                               \
      _Pragma("omp for schedule(dynamic, 1)")                                                               \
      for (long task = 0; task < nb * nkv; task++) {                                                        \
        long b = task / nkv, g = task % nkv;                                                                \
        kv_transpose(kt, k, b, g, nt, nkv, d, tp);                                                          \
        for (long i = 0; i < nt; i++) {                                                                     \
          long tl = i + 1, tv = (tl + L - 1) / L * L;                                                       \
          for (long hh = 0; hh < group; hh++) {                                                             \
            long h = g * group + hh;                                                                        \
            const float *qi = q + ((b * nt + i) * nh + h) * d;                                              \
            long t = 0;                          /* acc[t] = sum_j q[j] * k[t, j], j ascending, fp32 */     \
            for (; t + 4 * L <= tv; t += 4 * L) {  /* four vectors of keys in flight: their chains overlap */ \
              VF a0 = SPLAT(VF, 0.0f), a1 = a0, a2 = a0, a3 = a0;                                           \
              for (long j = 0; j < d; j++) {                                                                \
                VF qj = SPLAT(VF, qi[j]);                                                                   \
                const float *kr = kt + j * tp + t;                                                          \
                a0 = a0 + qj * LDV(VF, kr); a1 = a1 + qj * LDV(VF, kr + L);                                 \
                a2 = a2 + qj * LDV(VF, kr + 2 * L); a3 = a3 + qj * LDV(VF, kr + 3 * L);                     \
              }                                                                                             \
              STV(acc + t, a0); STV(acc + t + L, a1); STV(acc + t + 2 * L, a2); STV(acc + t + 3 * L, a3);   \
            }                                                                                               \
            for (; t + 2 * L <= tv; t += 2 * L) {  /* two (AVX-512's 16-key vectors: a 28-token row's keys) */ \
              VF a0 = SPLAT(VF, 0.0f), a1 = a0;                                                             \
              for (long j = 0; j < d; j++) {                                                                \
                VF qj = SPLAT(VF, qi[j]);                                                                   \
                a0 = a0 + qj * LDV(VF, kt + j * tp + t); a1 = a1 + qj * LDV(VF, kt + j * tp + t + L);       \
              }                                                                                             \
              STV(acc + t, a0); STV(acc + t + L, a1);                                                       \
            }                                                                                               \
            for (; t < tv; t += L) {                                                                        \
              VF a = SPLAT(VF, 0.0f);                                                                       \
              for (long j = 0; j < d; j++) a = a + SPLAT(VF, qi[j]) * LDV(VF, kt + j * tp + t);              \
              STV(acc + t, a);                                                                              \
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
            memset(o, 0, d * sizeof(float));                                                                \
            for (long t = 0; t < tl; t++) {      /* o[j] += p_t * v[t, j], t ascending, fp32 */             \
              const float *vt = v + ((b * nt + t) * nkv + g) * d;                                           \
              VF p = SPLAT(VF, sc[t]);                                                                      \
              long j = 0;                                                                                   \
              for (; j + L <= d; j += L) STV(o + j, LDV(VF, o + j) + p * LDV(VF, vt + j));                  \
              for (; j < d; j++) o[j] = o[j] + sc[t] * vt[j];                                               \
            }                                                                                               \
          }                                                                                                 \
        }                                                                                                   \
      }                                                                                                     \
      free(kt); free(acc); free(sc);                                                                        \
    }                                                                                                       \
  }

/* Gradients: dq, dout: [B, T, H, D]; dk, dv: [B, T, Hkv, D]; P, S: [B, T, H, T] (S: scratch). */
#define BWD(NAME, ATTR, VD)                                                                                  \
  ATTR static void NAME(const float *q, const float *k, const float *v, const float *dout, const float *P,  \
                        float *S, float *dq, float *dk, float *dv, long nb, long nt, long nh, long nkv,     \
                        long d, double scale, int threads) {                                                \
    enum { L = sizeof(VD) / sizeof(double) };                                                               \
    long group = nh / nkv, tp = (nt + L - 1) / L * L;                                                              \
    _Pragma("omp parallel num_threads(threads)")                                                            \
    {                                                                                                       \
      float *vt = calloc((size_t)d * tp, sizeof(float));                                                    \
      double *dp = malloc(tp * sizeof(double)), *acc = malloc((d + L) * sizeof(double));                    \
      double *ak = malloc((d + L) * sizeof(double)), *av = malloc((d + L) * sizeof(double));                \
      _Pragma("omp for schedule(dynamic, 1)")                                                               \
      for (long task = 0; task < nb * nkv; task++) {                                                        \
        long b = task / nkv, g = task % nkv;                                                                \
        kv_transpose(vt, v, b, g, nt, nkv, d, tp);                                                          \
        for (long i = 0; i < nt; i++) {                                                                     \
          long tl = i + 1, tv = (tl + L - 1) / L * L;                                                           \
          for (long hh = 0; hh < group; hh++) {                                                             \
            long h = g * group + hh, row = (b * nt + i) * nh + h;                                           \
            const float *oi = dout + row * d, *pi = P + row * nt;                                           \
            float *si = S + row * nt;                                                                       \
            long t = 0;                          /* dp_t = sum_j dout_j v[t, j], j ascending, float64 */    \
            for (; t + 4 * L <= tv; t += 4 * L) {  /* four vectors of keys in flight */                      \
              VD a0 = SPLAT(VD, 0.0), a1 = a0, a2 = a0, a3 = a0;                                               \
              for (long j = 0; j < d; j++) {                                                                \
                VD oj = SPLAT(VD, (double)oi[j]);                                                              \
                const float *vr = vt + j * tp + t;                                                          \
                a0 = a0 + oj * LDFD(VD, vr); a1 = a1 + oj * LDFD(VD, vr + L);                                 \
                a2 = a2 + oj * LDFD(VD, vr + 2 * L); a3 = a3 + oj * LDFD(VD, vr + 3 * L);                        \
              }                                                                                             \
              STV(dp + t, a0); STV(dp + t + L, a1); STV(dp + t + 2 * L, a2); STV(dp + t + 3 * L, a3);  \
            }                                                                                               \
            for (; t < tv; t += L) {                                                                        \
              VD a = SPLAT(VD, 0.0);                                                                           \
              for (long j = 0; j < d; j++) a = a + SPLAT(VD, (double)oi[j]) * LDFD(VD, vt + j * tp + t);           \
              STV(dp + t, a);                                                                              \
            }                                                                                               \
            double c = 0.0;                                                                                 \
            for (long t = 0; t < tl; t++) c += (double)pi[t] * dp[t];                                       \
            for (long t = 0; t < tl; t++) si[t] = (float)((double)pi[t] * (dp[t] - c));                     \
            long j = 0;                          /* dq_j = sum_t ds_t k[t, j], t ascending, float64 */      \
            for (; j + 4 * L <= d; j += 4 * L) {  /* 4 L j's in four registers over all t */                 \
              VD a0 = SPLAT(VD, 0.0), a1 = a0, a2 = a0, a3 = a0;                                               \
              for (long t = 0; t < tl; t++) {                                                               \
                VD s4 = SPLAT(VD, (double)si[t]);                                                              \
                const float *kr = k + ((b * nt + t) * nkv + g) * d + j;                                     \
                a0 = a0 + s4 * LDFD(VD, kr); a1 = a1 + s4 * LDFD(VD, kr + L);                                 \
                a2 = a2 + s4 * LDFD(VD, kr + 2 * L); a3 = a3 + s4 * LDFD(VD, kr + 3 * L);                        \
              }                                                                                             \
              STV(acc + j, a0); STV(acc + j + L, a1); STV(acc + j + 2 * L, a2); STV(acc + j + 3 * L, a3);  \
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
          for (; j + 4 * L <= d; j += 4 * L) {    /* 4 L j's of dk and of dv in eight registers */            \
            VD k0 = SPLAT(VD, 0.0), k1 = k0, k2 = k0, k3 = k0, v0 = k0, v1 = k0, v2 = k0, v3 = k0;             \
            for (long i = t; i < nt; i++)                                                                   \
              for (long hh = 0; hh < group; hh++) {                                                         \
                long row = (b * nt + i) * nh + g * group + hh;                                              \
                VD s4 = SPLAT(VD, (double)S[row * nt + t]), p4 = SPLAT(VD, (double)P[row * nt + t]);              \
                const float *qi = q + row * d + j, *oi = dout + row * d + j;                                \
                k0 = k0 + s4 * LDFD(VD, qi); k1 = k1 + s4 * LDFD(VD, qi + L);                                 \
                k2 = k2 + s4 * LDFD(VD, qi + 2 * L); k3 = k3 + s4 * LDFD(VD, qi + 3 * L);                        \
                v0 = v0 + p4 * LDFD(VD, oi); v1 = v1 + p4 * LDFD(VD, oi + L);                                 \
                v2 = v2 + p4 * LDFD(VD, oi + 2 * L); v3 = v3 + p4 * LDFD(VD, oi + 3 * L);                        \
              }                                                                                             \
            STV(ak + j, k0); STV(ak + j + L, k1); STV(ak + j + 2 * L, k2); STV(ak + j + 3 * L, k3); \
            STV(av + j, v0); STV(av + j + L, v1); STV(av + j + 2 * L, v2); STV(av + j + 3 * L, v3); \
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

FWD(fwd_generic, NOATTR, f8)
FWD(fwd_avx2, AVX2, f8)
FWD(fwd_avx512, AVX512, f16)
BWD(bwd_generic, NOATTR, d4)
BWD(bwd_avx2, AVX2, d4)
BWD(bwd_avx512, AVX512, d8)

void timbench_attend_causal(const float *q, const float *k, const float *v, float *out, float *probs, long nb,
                            long nt, long nh, long nkv, long d, double scale, int keep, int isa, int threads) {
  (isa == 2 ? fwd_avx512 : isa ? fwd_avx2 : fwd_generic)(q, k, v, out, probs, nb, nt, nh, nkv, d, scale, keep,
                                                         threads);
}

void timbench_attend_causal_bwd(const float *q, const float *k, const float *v, const float *dout,
                                const float *P, float *S, float *dq, float *dk, float *dv, long nb, long nt,
                                long nh, long nkv, long d, double scale, int isa, int threads) {
  (isa == 2 ? bwd_avx512 : isa ? bwd_avx2 : bwd_generic)(q, k, v, dout, P, S, dq, dk, dv, nb, nt, nh, nkv, d, scale,
                                                         threads);
}
