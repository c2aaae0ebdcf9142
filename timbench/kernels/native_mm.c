/* Fixed-order fp32 matmuls for timbench's exact kernels (see timbench/kernels/native.py).

   out[i, j] = sum_k X(i, k) * W(k, j), k ascending, from zero, every step either acc = acc + x * w (two
   roundings: the forward) or acc = fma(x, w, acc) (one: the backward). Nothing else is ever done to an
   output, so its value depends on its own row and column alone: not on the ISA the code was compiled for
   (AVX-512, AVX2 or SSE2: each vector lane is an IEEE fp32 operation), the tile it landed in, the thread that
   ran it or the number of rows. Compile with -ffp-contract=off (gcc would otherwise fuse the forward's mul + add).
   One source, three builds: the tile and driver macros below are instantiated per ISA with its vector type,
   tile shape and target attribute. */
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include <omp.h>

typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));
enum { KC = 256, MCB = 16 };

#define INLINE static inline __attribute__((always_inline))
#define LDV(T, p) ({ T v_; memcpy(&v_, (p), sizeof v_); v_; })
#define STV(p, v) ({ __typeof__(v) v_ = (v); memcpy((p), &v_, sizeof v_); })
INLINE v8 splat_generic(const float *p) { float s = *p; return (v8){s, s, s, s, s, s, s, s}; }
INLINE v8 fma_generic(v8 a, v8 b, v8 c) {  /* fmaf is correctly rounded: the FMA instruction's bits */
  v8 r;
  for (int i = 0; i < 8; i++) r[i] = fmaf(a[i], b[i], c[i]);
  return r;
}
#define MULADD(a, b, c) ((c) + (a) * (b))
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2,fma")))
#define NOATTR
#define SPLAT_AVX512(p) ((v16)_mm512_set1_ps(*(p)))
#define FMA_AVX512(a, b, c) ((v16)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define SPLAT_AVX2(p) ((v8)_mm256_broadcast_ss(p))
#define FMA_AVX2(a, b, c) ((v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))

/* One MRV x NR tile held in registers over k in [0, kn): NV vectors of type VT per row (NR = NV lanes * NV);
   W(k, j) = w[k * lw + j] (lw = NR for a packed panel). The accumulators start at zero (first) or at what `out`
   holds (a later k chunk: storing and reloading an fp32 value is exact, so the chunking never changes a bit).
   Rows r >= mr are computed on row 0 and dropped. */
#define TILE(NAME, MRV, NV, VT, STEP, SPLAT, ATTR)                                                       \
  ATTR INLINE void NAME(const float *x, long xr, long xk, const float *w, long lw, float *out, long lo,   \
                        long kn, int mr, int first) {                                                    \
    enum { L = sizeof(VT) / sizeof(float) };                                                             \
    VT c[MRV][NV];                                                                                       \
    long xo[MRV];                                                                                        \
    _Pragma("GCC unroll 16") for (int r = 0; r < MRV; r++) {                                             \
      xo[r] = (r < mr ? r : 0) * xr;                                                                     \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                               \
        c[r][v] = (r < mr && !first) ? LDV(VT, out + r * lo + v * L) : (VT){0};                          \
    }                                                                                                    \
    for (long k = 0; k < kn; k++) {                                                                      \
      VT wv[NV];                                                                                         \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) wv[v] = LDV(VT, w + k * lw + v * L);          \
      const float *xp = x + k * xk;                                                                      \
      _Pragma("GCC unroll 16") for (int r = 0; r < MRV; r++) {                                           \
        VT a = SPLAT(xp + xo[r]);                                                                        \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) c[r][v] = STEP(a, wv[v], c[r][v]);          \
      }                                                                                                  \
    }                                                                                                    \
    _Pragma("GCC unroll 16") for (int r = 0; r < MRV; r++)                                               \
      if (r < mr) { _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) STV(out + r * lo + v * L, c[r][v]); } \
  }

/* Around the tile. With `pack`, W is first copied panel by panel into `pan` ([nct][kdim][NR], the last panel
   zero-padded), so a tile reads NR contiguous floats per k that stay in L1 (W's own rows, NR floats
   every lw, collide in a few cache sets); without it (a W as tall as dW's, whose copy would cost more than it
   saves) only a ragged last panel is copied. Row blocks go in chunks of MCB that share each panel, k in chunks
   of KC. Threads split row blocks (or, with fewer row blocks than threads, column panels). */
#define DRIVER(NAME, TILEFN, MRV, NR, ATTR)                                                                     \
  ATTR static void NAME(const float *x, long xr, long xk, const float *w, long lw, float *out, long lo, \
                        long m, long kdim, long n, float *pan, int pack, int threads) {                  \
    long nrb = (m + MRV - 1) / MRV, nct = (n + NR - 1) / NR;                                             \
    _Pragma("omp parallel num_threads(threads)")                                                         \
    {                                                                                                    \
      int nt = omp_get_num_threads(), t = omp_get_thread_num();                                          \
      for (long ct = nct * t / nt; ct < nct * (t + 1) / nt; ct++) {                                      \
        long cols = n - ct * NR < NR ? n - ct * NR : NR;                                                 \
        if (!pack && cols == NR) continue;                                                               \
        float *p = pan + (pack ? ct : 0) * kdim * NR;                                                    \
        for (long k = 0; k < kdim; k++) {                                                                \
          memcpy(p + k * NR, w + k * lw + ct * NR, cols * sizeof(float));                                \
          memset(p + k * NR + cols, 0, (NR - cols) * sizeof(float));                                     \
        }                                                                                                \
      }                                                                                                  \
      _Pragma("omp barrier")                                                                             \
      int by_rows = nrb >= nt;                                                                           \
      long r_lo = by_rows ? nrb * t / nt : 0, r_hi = by_rows ? nrb * (t + 1) / nt : nrb;                 \
      long c_lo = by_rows ? 0 : nct * t / nt, c_hi = by_rows ? nct : nct * (t + 1) / nt;                 \
      float tmp[MRV * NR];                                                                               \
      for (long k0 = 0; k0 < kdim; k0 += KC) {                                                           \
        long kn = kdim - k0 < KC ? kdim - k0 : KC;                                                       \
        for (long rc = r_lo; rc < r_hi; rc += MCB) {                                                     \
          long rc_hi = rc + MCB < r_hi ? rc + MCB : r_hi;                                                \
          for (long ct = c_lo; ct < c_hi; ct++) {                                                        \
            long j0 = ct * NR, cols = n - j0 < NR ? n - j0 : NR;                                         \
            const float *wp = (pack || cols < NR) ? pan + (pack ? ct : 0) * kdim * NR + k0 * NR : w + k0 * lw + j0; \
            long wl = (pack || cols < NR) ? NR : lw;                                                     \
            for (long rb = rc; rb < rc_hi; rb++) {                                                       \
              long i0 = rb * MRV;                                                                        \
              int mr = m - i0 < MRV ? (int)(m - i0) : MRV;                                               \
              const float *xp = x + i0 * xr + k0 * xk;                                                   \
              if (cols < NR) {                                                                           \
                for (int r = 0; r < mr; r++) memcpy(tmp + r * NR, out + (i0 + r) * lo + j0, cols * sizeof(float)); \
                TILEFN(xp, xr, xk, wp, wl, tmp, NR, kn, mr, k0 == 0);                                        \
                for (int r = 0; r < mr; r++) memcpy(out + (i0 + r) * lo + j0, tmp + r * NR, cols * sizeof(float)); \
              } else {                                                                                   \
                TILEFN(xp, xr, xk, wp, wl, out + i0 * lo + j0, lo, kn, mr, k0 == 0);                         \
              }                                                                                          \
            }                                                                                            \
          }                                                                                              \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
  }

/* Register budget per tile (MRV rows x NR columns, the accumulators held over all of k). AVX2 (16 ymm): mul + add
   needs a temporary per product, 4 x 16 (8 accumulators, 2 W, 1 x, 2 products: 13); FMA does not, 6 x 16
   (12 + 2 + 1 = 15). AVX-512 (32 zmm): MR_ADD512 x 32 and MR_FMA512 x 32 likewise. Each keeps more chains in
   flight than the add/FMA latency needs; SSE2 runs the AVX2 tiles' shapes, each 8-lane vector as two. */
#ifndef MR_ADD512
#define MR_ADD512 8
#endif
#ifndef MR_FMA512
#define MR_FMA512 12
#endif
TILE(tile_add_generic, 4, 2, v8, MULADD, splat_generic, NOATTR)
TILE(tile_fma_generic, 6, 2, v8, fma_generic, splat_generic, NOATTR)
TILE(tile_add_avx2, 4, 2, v8, MULADD, SPLAT_AVX2, AVX2)
TILE(tile_fma_avx2, 6, 2, v8, FMA_AVX2, SPLAT_AVX2, AVX2)
TILE(tile_add_avx512, MR_ADD512, 2, v16, MULADD, SPLAT_AVX512, AVX512)
TILE(tile_fma_avx512, MR_FMA512, 2, v16, FMA_AVX512, SPLAT_AVX512, AVX512)
DRIVER(mm_add_generic, tile_add_generic, 4, 16, NOATTR)
DRIVER(mm_fma_generic, tile_fma_generic, 6, 16, NOATTR)
DRIVER(mm_add_avx2, tile_add_avx2, 4, 16, AVX2)
DRIVER(mm_fma_avx2, tile_fma_avx2, 6, 16, AVX2)
DRIVER(mm_add_avx512, tile_add_avx512, MR_ADD512, 32, AVX512)
DRIVER(mm_fma_avx512, tile_fma_avx512, MR_FMA512, 32, AVX512)

/* The best build this CPU runs: 2 AVX-512 (avx512f), 1 AVX2 + FMA, 0 SSE2. Any of them gives the same bits. */
int timbench_isa(void) {
  if (__builtin_cpu_supports("avx512f")) return 2;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* The tile's columns NR of build `isa`: timbench_mm's packing scratch comes in panels of NR. */
int timbench_nr(int isa) { return isa == 2 ? 32 : 16; }

/* out[i, j] (row stride lo) = sum_k x[i*xr + k*xk] * w[k*lw + j] over i < m, j < n, k < kdim ascending.
   fused: FMA steps, else mul + add; isa: the build (as timbench_isa; only one this CPU runs).
   pan: scratch of ceil(n / NR) * NR * kdim floats with pack, NR * kdim without (unused when NR divides n). */
void timbench_mm(const float *x, long xr, long xk, const float *w, long lw, float *out, long lo,
                 long m, long kdim, long n, int fused, int isa, float *pan, int pack, int threads) {
  if (m <= 0 || n <= 0) return;
  if (kdim <= 0) { for (long i = 0; i < m; i++) memset(out + i * lo, 0, n * sizeof(float)); return; }
  if (isa == 2) (fused ? mm_fma_avx512 : mm_add_avx512)(x, xr, xk, w, lw, out, lo, m, kdim, n, pan, pack, threads);
  else if (isa == 1) (fused ? mm_fma_avx2 : mm_add_avx2)(x, xr, xk, w, lw, out, lo, m, kdim, n, pan, pack, threads);
  else (fused ? mm_fma_generic : mm_add_generic)(x, xr, xk, w, lw, out, lo, m, kdim, n, pan, pack, threads);
}

/* Grouped: segment s is timbench_mm(xs[s], xr, xk, ws[s], lw, outs[s], lo, ms[s], ks[s], n, ...), run one after
   another (each exactly as timbench_mm alone: the same bits). The MoE experts' projections in one call, expert s's
   rows times expert s's weight (ms varies) or expert s's weight gradient over its rows (ks varies); pan as
   timbench_mm's for the largest k, packs[s] as the caller would pass to timbench_mm for segment s. */
void timbench_mm_grouped(long nseg, const long *xs, long xr, long xk, const long *ws, long lw, const long *outs,
                         long lo, const long *ms, const long *ks, long n, int fused, int isa, float *pan,
                         const int *packs, int threads) {
  for (long s = 0; s < nseg; s++)
    timbench_mm((const float *)xs[s], xr, xk, (const float *)ws[s], lw, (float *)outs[s], lo, ms[s], ks[s], n, fused,
                isa, pan, packs[s], threads);
}
