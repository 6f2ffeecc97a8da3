/* The int8 convolution accumulator of the host build on processors with AVX512-VNNI,
 * called by the kernels the lowerings of 8-bit convolutions and matrix products build (an
 * extern call per output row, or per block of columns of a row, in TVM's parallel loop).
 *
 *   acc[r, ox, oc] = sum_{ky, kx, c} u[b, oy*sy + ky*dy, ox*sx + kx*dx, c] * w[oc, c, ky, kx]
 *                    - corr[oc],              r = b*oh + oy
 *
 * u: the input's codes as unsigned bytes, padded: NHWC [n, hp, wp, cp], cp % 4 == 0.
 * w: the weights' signed codes packed [o/16, kh, kw, cp/4, 16, 4] (16 output channels by
 *    4 input channels: one 64-byte vector per step of vpdpbusd).
 * corr: the zero-point correction per output channel.
 * acc: int32, the result's layout: NHWC [n, oh, ow, o], or NCHW [n, o, oh, ow] (nchw != 0;
 *    accumulated in a scratch block on the stack and transposed 16 x 16 on the way out).
 *    o % 16 == 0.
 *
 * vpdpbusd adds four u8 x s8 products into each int32 lane without saturating, so the sum
 * is exact modulo 2**32: exact wherever the true accumulator fits int32, which the
 * lowering checks before it calls this. Integer only; nothing here rounds. */
#include <immintrin.h>
#include <stdint.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* NP output columns by NB blocks of 16 output channels, accumulators in registers */
ALWAYS_INLINE void tile(const int NP, const int NB, const uint8_t* u0, const int8_t* w0,
                        const int32_t* corr, int32_t* out, int32_t o, int32_t kh,
                        int32_t kw, int32_t cp, int32_t wp, int32_t sx, int32_t dy,
                        int32_t dx, int64_t wblock) {
  __m512i acc[8][4];
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[p][j] = _mm512_setzero_si512();
  const int32_t c4 = cp / 4;
  for (int32_t ky = 0; ky < kh; ++ky) {
    for (int32_t kx = 0; kx < kw; ++kx) {
      const uint8_t* x = u0 + ((int64_t)ky * dy * wp + (int64_t)kx * dx) * cp;
      const int8_t* wk = w0 + ((int64_t)ky * kw + kx) * c4 * 64;
      for (int32_t c = 0; c < c4; ++c) {
        __m512i wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(wk + j * wblock + c * 64);
#pragma GCC unroll 8
        for (int p = 0; p < NP; ++p) {
          const __m512i a = _mm512_set1_epi32(*(const int32_t*)(x + ((int64_t)p * sx * cp) + c * 4));
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) acc[p][j] = _mm512_dpbusd_epi32(acc[p][j], a, wv[j]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    const __m512i cv = _mm512_loadu_si512(corr + j * 16);
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p)
      _mm512_storeu_si512(out + (int64_t)p * o + j * 16, _mm512_sub_epi32(acc[p][j], cv));
  }
}

/* the columns of one output row for NB channel blocks starting at block ob */
ALWAYS_INLINE void columns(const int NB, const uint8_t* row, const int8_t* w, const int32_t* corr,
                           int32_t* out, int32_t ow, int32_t o, int32_t kh, int32_t kw,
                           int32_t cp, int32_t wp, int32_t sx, int32_t dy, int32_t dx,
                           int64_t wblock, int32_t ob) {
  const int8_t* w0 = w + ob * wblock;
  int32_t ox = 0;
  for (; ox + 6 <= ow; ox += 6)
    tile(6, NB, row + (int64_t)ox * sx * cp, w0, corr + ob * 16, out + (int64_t)ox * o + ob * 16,
         o, kh, kw, cp, wp, sx, dy, dx, wblock);
  const uint8_t* u0 = row + (int64_t)ox * sx * cp;
  int32_t* out0 = out + (int64_t)ox * o + ob * 16;
  switch (ow - ox) {
#define REST(n) case n: tile(n, NB, u0, w0, corr + ob * 16, out0, o, kh, kw, cp, wp, sx, dy, dx, wblock); break;
    REST(1) REST(2) REST(3) REST(4) REST(5)
#undef REST
    default: break;
  }
}

/* a 16 x 16 block of int32 transposed in registers: r[i] lane j becomes r[j] lane i */
ALWAYS_INLINE void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {        /* r[4i + k], 128-bit lane L: column 4L + k, rows 4i.. */
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i p = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x44);
    const __m512i q = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xEE);
    const __m512i p2 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x44);
    const __m512i q2 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xEE);
    t[k] = _mm512_shuffle_i32x4(p, p2, 0x88);
    t[4 + k] = _mm512_shuffle_i32x4(p, p2, 0xDD);
    t[8 + k] = _mm512_shuffle_i32x4(q, q2, 0x88);
    t[12 + k] = _mm512_shuffle_i32x4(q, q2, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

/* the row s [ow, o] written to out [o, stride] (channel c at out + c * stride) */
static void transpose_row(const int32_t* s, int32_t ow, int32_t o, int32_t* out, int64_t stride) {
  for (int32_t c0 = 0; c0 < o; c0 += 16) {
    int32_t x0 = 0;
    for (; x0 + 16 <= ow; x0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(s + (int64_t)(x0 + i) * o + c0);
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(out + (c0 + j) * stride + x0, r[j]);
    }
    for (; x0 < ow; ++x0)
      for (int j = 0; j < 16; ++j) out[(c0 + j) * stride + x0] = s[(int64_t)x0 * o + c0 + j];
  }
}

/* int32 elements of the scratch block an NCHW result is transposed from (on the stack) */
#define SCRATCH 32768

/* columns [x_begin, x_end) of output row r = b*oh + oy (returns 0). NCHW: in passes of up
 * to SCRATCH / o columns (a multiple of 16; the lowering keeps o <= SCRATCH / 16). A matrix
 * product [M, K] x [N, K]^T is the 1x1 convolution of one row of M columns. */
int32_t bevir_vnni_conv(const uint8_t* u, const int8_t* w, const int32_t* corr, int32_t* acc,
                        int32_t r, int32_t x_begin, int32_t x_end, int32_t hp, int32_t wp,
                        int32_t cp, int32_t oh, int32_t ow, int32_t o, int32_t kh, int32_t kw,
                        int32_t sy, int32_t sx, int32_t dy, int32_t dx, int32_t nchw) {
  int32_t scratch[SCRATCH] __attribute__((aligned(64)));
  const int32_t b = r / oh, oy = r % oh;
  const uint8_t* row = u + (((int64_t)b * hp + (int64_t)oy * sy) * wp) * cp;
  const int64_t wblock = (int64_t)kh * kw * cp * 16;    /* bytes per block of 16 channels */
  const int32_t blocks = o / 16;
  const int32_t chunk = nchw ? SCRATCH / o / 16 * 16 : x_end - x_begin;
  for (int32_t x0 = x_begin; x0 < x_end; x0 += chunk) {
    const int32_t nx = x_end - x0 < chunk ? x_end - x0 : chunk;
    const uint8_t* src = row + (int64_t)x0 * sx * cp;
    int32_t* dst = nchw ? scratch : acc + ((int64_t)r * ow + x0) * o;
    int32_t ob = 0;
    for (; ob + 4 <= blocks; ob += 4)
      columns(4, src, w, corr, dst, nx, o, kh, kw, cp, wp, sx, dy, dx, wblock, ob);
    switch (blocks - ob) {
      case 3: columns(3, src, w, corr, dst, nx, o, kh, kw, cp, wp, sx, dy, dx, wblock, ob); break;
      case 2: columns(2, src, w, corr, dst, nx, o, kh, kw, cp, wp, sx, dy, dx, wblock, ob); break;
      case 1: columns(1, src, w, corr, dst, nx, o, kh, kw, cp, wp, sx, dy, dx, wblock, ob); break;
      default: break;
    }
    if (nchw)
      transpose_row(scratch, nx, o, acc + ((int64_t)b * o * oh + oy) * ow + x0, (int64_t)oh * ow);
  }
  return 0;
}
