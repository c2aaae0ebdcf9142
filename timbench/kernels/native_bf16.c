/* bf16 <-> fp32 conversions for timbench's exact kernels (see timbench/kernels/bf16.py).

   Integer arithmetic on the bit patterns only, so every build (AVX-512, AVX2, plain: gcc's target_clones picks
   the best this CPU runs at load time) gives the same bits:
   - widening: the fp32 whose bits are the bf16's followed by 16 zero bits (exact, NaN payloads kept: what
     torch's bf16 -> fp32 copy does);
   - rounding: round to nearest, ties to even, by adding 0x7FFF plus the kept part's lowest bit and dropping the
     low 16 bits (what torch's fp32 -> bf16 copy does on every value but a NaN: finite values that round past
     the largest bf16 become inf, subnormals round like any other value, -0 stays -0). Which NaN torch writes
     depends on the ISA its copy kernel runs (0xFFFF vectorised, 0x7FC0 scalar), so NaNs are counted and left
     to torch. */
#include <stdint.h>

#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
/* Elementwise, so splitting the range over threads cannot change a bit; only arrays large enough to repay the
   threads' start-up are split (the matmul tiles' thread count, passed in, as timbench's kernels do). */
#define PAR_MIN 32768

/* dst[i] = widen(src[i]) for i < n. */
CLONES void timbench_bf16_widen(const uint16_t *src, uint32_t *dst, long n, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (n >= PAR_MIN && threads > 1)
  for (long i = 0; i < n; i++) dst[i] = (uint32_t)src[i] << 16;
}

/* dst[j, i] = widen(src[i, j]): src [rows, cols] row-major, dst [cols, rows] row-major (a weight's transpose,
   the layout the matmul tile reads). In 32 x 32 blocks so both sides stay in cache. */
CLONES void timbench_bf16_widen_t(const uint16_t *src, long rows, long cols, uint32_t *dst, int threads) {
  enum { B = 32 };
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * cols >= PAR_MIN && threads > 1)
  for (long i0 = 0; i0 < rows; i0 += B) {
    long i1 = i0 + B < rows ? i0 + B : rows;
    for (long j0 = 0; j0 < cols; j0 += B) {
      long j1 = j0 + B < cols ? j0 + B : cols;
      for (long j = j0; j < j1; j++)
        for (long i = i0; i < i1; i++) dst[j * rows + i] = (uint32_t)src[i * cols + j] << 16;
    }
  }
}

/* out[i] = round(a[i]) and a[i] = widen(out[i]) for every non-NaN a[i], in one pass; a NaN a[i] is left as it
   is (out[i] then holds no meaningful value). Returns the number of NaNs. */
CLONES long timbench_bf16_round(uint32_t *a, uint16_t *out, long n, int threads) {
  long nans = 0;
#pragma omp parallel for schedule(static) num_threads(threads) if (n >= PAR_MIN && threads > 1) reduction(+ : nans)
  for (long i = 0; i < n; i++) {
    uint32_t u = a[i];
    uint32_t nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    out[i] = (uint16_t)r;
    a[i] = nan ? u : r << 16;
    nans += nan;
  }
  return nans;
}
