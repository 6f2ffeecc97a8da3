/* Native kernels of the golden model (bevir/ops/native/__init__.py). Each performs the
 * IEEE operations of the numpy code it stands in for, in the same order: built with
 * -ffp-contract=off and without fast math, a multiply and an add round separately.
 *
 * Both kernels run windows over a padded NHWC input xp [n, hp, wp, c] into out [n, oh, ow, c]
 * (all C-contiguous); dims: n, hp, wp, c, oh, ow, kh, kw, sh, sw, dh, dw. They return 0, or
 * -1 (having written nothing) where the tap offsets cannot be allocated. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* The element offsets of a window's taps from its first, in (kh, kw) order (malloc'd). */
static ptrdiff_t *tap_offsets(const int64_t *d) {
  int64_t wp = d[2], c = d[3], kh = d[6], kw = d[7], dh = d[10], dw = d[11];
  ptrdiff_t *off = malloc(sizeof(ptrdiff_t) * (size_t)(kh * kw));
  if (off)
    for (int64_t t = 0; t < kh * kw; t++) off[t] = ((t / kw) * dh * wp + (t % kw) * dw) * c;
  return off;
}

/* For each output pixel: o, its c results, and s, its window's first tap. */
#define FOR_EACH_PIXEL(T, xp, out, d, ...)                                                  \
  for (int64_t b = 0; b < d[0]; b++)                                                      \
    for (int64_t y = 0; y < d[4]; y++)                                                    \
      for (int64_t x = 0; x < d[5]; x++) {                                                \
        T *o = out + ((b * d[4] + y) * d[5] + x) * d[3];                                  \
        const T *s = xp + ((b * d[1] + y * d[8]) * d[2] + x * d[9]) * d[3];               \
        __VA_ARGS__                                                                       \
      }

/* BYTES-byte vectors of T, loaded from and stored to unaligned memory. */
#define VECTOR(V, T, BYTES)                                                               \
  typedef T V __attribute__((vector_size(BYTES), aligned(sizeof(T))));                    \
  static inline V V##_ld(const T *p) { V v; memcpy(&v, p, sizeof v); return v; }

/* Channels k.. of P pixels (see DEPTHWISE_PIXELS) in vectors V, while a whole one fits. */
#define DEPTHWISE_SWEEP(V, T, P)                                                          \
  for (; k + (int64_t)(sizeof(V) / sizeof(T)) <= c; k += sizeof(V) / sizeof(T)) {        \
    V a[P], w = V##_ld(wt + k);                                                           \
    for (int p = 0; p < P; p++) a[p] = V##_ld(s + p * step + k) * w;                      \
    for (int64_t t = 1; t < nt; t++) {                                                    \
      w = V##_ld(wt + t * c + k);                                                         \
      for (int p = 0; p < P; p++) a[p] = a[p] + V##_ld(s + p * step + off[t] + k) * w;    \
    }                                                                                     \
    for (int p = 0; p < P; p++) memcpy(o + p * c + k, &a[p], sizeof(V));                  \
  }

/* P pixels of an output row (their windows `step` elements apart from s, their results c
 * apart from o) in one sweep over the taps: each tap's weights loaded once for the P, a
 * vector V of channels at a time, then a half vector V##_h (what is left of few or odd
 * channels: the same operations, lane by lane), then one channel at a time; each pixel's
 * products in tap order, the first stored, each next one added. */
#define DEPTHWISE_PIXELS(V, T, P)                                                         \
  {                                                                                       \
    int64_t k = 0;                                                                        \
    DEPTHWISE_SWEEP(V, T, P)                                                              \
    DEPTHWISE_SWEEP(V##_h, T, P)                                                          \
    for (; k < c; k++)                                                                    \
      for (int p = 0; p < P; p++) {                                                       \
        T a = s[p * step + k] * wt[k];                                                    \
        for (int64_t t = 1; t < nt; t++) a = a + s[p * step + off[t] + k] * wt[t * c + k]; \
        o[p * c + k] = a;                                                                 \
      }                                                                                   \
  }

/* Depthwise convolution: out[b, y, x, c] = the products xp[tap, c] * wt[t, c] of the taps t
 * in (kh, kw) order, the first stored, each next one added (kernels.conv.depthwise_conv_nhwc).
 * Four pixels of a row at once (DEPTHWISE_PIXELS: the weights, loaded once for them, and
 * the loads of the input are what bounds it), then one at a time. (Where two NaNs meet in
 * an add, the compiler's operand order decides which one's sign and payload survive.) */
#define DEPTHWISE(NAME, T)                                                                \
  VECTOR(NAME##_v, T, 32)                                                                 \
  VECTOR(NAME##_v_h, T, 16)                                                               \
  int NAME(const T *xp, const T *wt, T *out, const int64_t *d) {                          \
    const int64_t c = d[3], nt = d[6] * d[7], step = d[9] * c;                            \
    ptrdiff_t *off = tap_offsets(d);                                                      \
    if (!off) return -1;                                                                  \
    for (int64_t b = 0; b < d[0]; b++)                                                    \
      for (int64_t y = 0; y < d[4]; y++) {                                                \
        const T *row = xp + (b * d[1] + y * d[8]) * d[2] * c;                             \
        T *orow = out + (b * d[4] + y) * d[5] * c;                                        \
        int64_t x = 0;                                                                    \
        for (; x + 4 <= d[5]; x += 4) {                                                   \
          const T *s = row + x * step;                                                    \
          T *o = orow + x * c;                                                            \
          DEPTHWISE_PIXELS(NAME##_v, T, 4)                                                \
        }                                                                                 \
        for (; x < d[5]; x++) {                                                           \
          const T *s = row + x * step;                                                    \
          T *o = orow + x * c;                                                            \
          DEPTHWISE_PIXELS(NAME##_v, T, 1)                                                \
        }                                                                                 \
      }                                                                                   \
    free(off);                                                                            \
    return 0;                                                                             \
  }

DEPTHWISE(bevir_depthwise_f32, float)
DEPTHWISE(bevir_depthwise_f64, double)

/* Vectors V of BYTES bytes of T and their maximum select (see MAXPOOL), through the vectors
 * V##_m of I, the integer type of T's width. */
#define MAX_VECTOR(V, T, I, BYTES)                                                        \
  VECTOR(V, T, BYTES)                                                                     \
  typedef I V##_m __attribute__((vector_size(BYTES), aligned(sizeof(T))));                \
  static inline V V##_max(V m, V v) {                                                     \
    V##_m keep = (m > v) | (m != m);                                                      \
    return (V)(((V##_m)m & keep) | ((V##_m)v & ~keep));                                   \
  }

/* A pixel's window maxima of channels k.. in vectors V while a whole one fits. */
#define MAX_SWEEP(V)                                                                      \
  for (; k + (int64_t)(sizeof(V) / sizeof *s) <= c; k += sizeof(V) / sizeof *s) {         \
    V m = V##_ld(s + k);                                                                  \
    for (int64_t t = 1; t < nt; t++) m = V##_max(m, V##_ld(s + off[t] + k));              \
    memcpy(o + k, &m, sizeof m);                                                          \
  }

/* Max pooling: out[b, y, x, c] = the maximum of the window's taps in (kh, kw) order, each
 * next tap v taken as numpy's maximum (on x86-64) takes its second operand:
 * m = (m > v || m is NaN) ? m : v, so a NaN wins and an equal value replaces m (maximum(-0,
 * +0) is +0). The vector select works on bits; 64-byte vectors (AVX-512), then 32-byte ones
 * (few channels: a scalar tail would cost far more), then one at a time. xp is padded with
 * T's lowest value. */
#define MAXPOOL(NAME, T, I)                                                               \
  MAX_VECTOR(NAME##_z, T, I, 64)                                                          \
  MAX_VECTOR(NAME##_y, T, I, 32)                                                          \
  int NAME(const T *xp, T *out, const int64_t *d) {                                       \
    const int64_t c = d[3], nt = d[6] * d[7];                                             \
    ptrdiff_t *off = tap_offsets(d);                                                      \
    if (!off) return -1;                                                                  \
    FOR_EACH_PIXEL(T, xp, out, d, {                                                       \
      int64_t k = 0;                                                                      \
      MAX_SWEEP(NAME##_z)                                                                 \
      MAX_SWEEP(NAME##_y)                                                                 \
      for (; k < c; k++) {                                                                \
        T m = s[k];                                                                       \
        for (int64_t t = 1; t < nt; t++) {                                                \
          T v = s[off[t] + k];                                                            \
          m = (m > v || m != m) ? m : v;                                                  \
        }                                                                                 \
        o[k] = m;                                                                         \
      }                                                                                   \
    })                                                                                    \
    free(off);                                                                            \
    return 0;                                                                             \
  }

MAXPOOL(bevir_maxpool_f32, float, int32_t)
MAXPOOL(bevir_maxpool_f64, double, int64_t)
MAXPOOL(bevir_maxpool_i8, int8_t, int8_t)
MAXPOOL(bevir_maxpool_u8, uint8_t, int8_t)
MAXPOOL(bevir_maxpool_i16, int16_t, int16_t)
MAXPOOL(bevir_maxpool_i32, int32_t, int32_t)

/* Group-major im2col of a grouped convolution (kernels.conv.im2col_nhwc): out[g, b, y, x, t, :] =
 * the cg = c / groups channels of group g at tap t (in (kh, kw) order) of pixel (b, y, x)'s
 * window. A copy of 4-byte elements (numpy copies runs of a few channels slowly), in 32-byte
 * vectors. dims: the window kernels', then groups. */
VECTOR(im2col_v, uint32_t, 32)
int bevir_im2col_u32(const uint32_t *xp, uint32_t *q, const int64_t *d) {
  const int64_t groups = d[12], cg = d[3] / groups, nt = d[6] * d[7], lanes = 8;
  ptrdiff_t *off = tap_offsets(d);
  if (!off) return -1;
  for (int64_t g = 0; g < groups; g++)
    for (int64_t b = 0; b < d[0]; b++)
      for (int64_t y = 0; y < d[4]; y++)
        for (int64_t x = 0; x < d[5]; x++) {
          const uint32_t *s = xp + ((b * d[1] + y * d[8]) * d[2] + x * d[9]) * d[3] + g * cg;
          for (int64_t t = 0; t < nt; t++, q += cg) {
            int64_t k = 0;
            for (; k + lanes <= cg; k += lanes) {
              im2col_v v = im2col_v_ld(s + off[t] + k);
              memcpy(q + k, &v, sizeof v);
            }
            for (; k < cg; k++) q[k] = s[off[t] + k];
          }
        }
  free(off);
  return 0;
}

/* Gathered multiply-accumulate (fx_ms_deform_attn's sampling): for each of `rows` rows r
 * and its `points` taps p, acc[r, :] += v[idx[r, p], :] * cw[r, p] over `depth` channels,
 * in int32 arithmetic that wraps as numpy's does (done in uint32: the same bits, no
 * undefined overflow). dims: rows, points, depth. idx is checked by the caller. */
#define GATHER_MAC(NAME, T)                                                               \
  int NAME(const T *v, const int64_t *idx, const int32_t *cw, uint32_t *acc,             \
           const int64_t *d) {                                                            \
    const int64_t rows = d[0], points = d[1], depth = d[2];                               \
    for (int64_t r = 0; r < rows; r++) {                                                  \
      uint32_t *a = acc + r * depth;                                                      \
      for (int64_t p = 0; p < points; p++) {                                              \
        const T *s = v + idx[r * points + p] * depth;                                     \
        const uint32_t w = (uint32_t)cw[r * points + p];                                  \
        for (int64_t k = 0; k < depth; k++) a[k] += (uint32_t)(int32_t)s[k] * w;          \
      }                                                                                   \
    }                                                                                     \
    return 0;                                                                             \
  }

GATHER_MAC(bevir_gather_mac_i8, int8_t)
GATHER_MAC(bevir_gather_mac_i16, int16_t)

/* Exact u8 x s8 matrix product (qlinear_conv's integer GEMM): out[m, n] = sum over k of
 * a[m, k] * w[k, n] in int32 (vpdpbusd adds four u8 x s8 products into each lane, without
 * saturation). a: u8 [M, K4*4]; wp: w packed as s8 [NB][K4][16][4] (16 output columns per
 * block, 4 k per lane, zero padded); out: int32 [M, N]. dims: M, K4, NB, N. Returns -1
 * where the processor (the build) has no AVX512-VNNI: the caller falls back. A tile of 4
 * rows x 32 columns keeps 8 accumulators in registers. */
int bevir_u8s8_gemm(const uint8_t *a, const int8_t *wp, int32_t *out, const int64_t *d) {
#ifdef __AVX512VNNI__
  const int64_t M = d[0], K4 = d[1], NB = d[2], N = d[3];
  for (int64_t nb = 0; nb < NB; nb += 2) {
    const int two = nb + 1 < NB;
    const int8_t *b[2] = {wp + nb * K4 * 64, wp + (nb + two) * K4 * 64};
    __mmask16 mask[2];
    for (int j = 0; j < 2; j++) {
      const int64_t left = N - (nb + j) * 16;
      mask[j] = (j && !two) || left <= 0 ? 0 : left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
    }
    for (int64_t m = 0; m < M; m += 4) {
      const int rows = M - m < 4 ? (int)(M - m) : 4;
      __m512i c[4][2];
      for (int r = 0; r < 4; r++) c[r][0] = c[r][1] = _mm512_setzero_si512();
      for (int64_t k = 0; k < K4; k++) {
        const __m512i w0 = _mm512_loadu_si512(b[0] + k * 64), w1 = _mm512_loadu_si512(b[1] + k * 64);
        for (int r = 0; r < rows; r++) {
          int32_t x;
          memcpy(&x, a + (m + r) * K4 * 4 + 4 * k, 4);
          const __m512i v = _mm512_set1_epi32(x);
          c[r][0] = _mm512_dpbusd_epi32(c[r][0], v, w0);
          c[r][1] = _mm512_dpbusd_epi32(c[r][1], v, w1);
        }
      }
      for (int r = 0; r < rows; r++) {
        _mm512_mask_storeu_epi32(out + (m + r) * N + nb * 16, mask[0], c[r][0]);
        _mm512_mask_storeu_epi32(out + (m + r) * N + nb * 16 + 16, mask[1], c[r][1]);
      }
    }
  }
  return 0;
#else
  (void)a; (void)wp; (void)out; (void)d;
  return -1;
#endif
}

/* Activations in place on float32 (the ops' numpy code: elementwise.relu_values, Clip,
 * HardSigmoid, Hardswish), each operation rounded as numpy rounds it and the comparisons
 * taken as numpy takes them on x86-64: maximum(v, 0) keeps v where v > 0 or v is a NaN;
 * clip(v, lo, hi) moves v only where it lies beyond a bound (a NaN and -0 at 0 stay). kind: 0 relu, 1 clip (p0, p1 the bounds),
 * 2 hardsigmoid (clip(v * p0 + p1, 0, 1)), 3 hardswish (v * hardsigmoid(v), p0 = 1/6,
 * p1 = 1/2); -1 none. dims: n, kind. */
static inline float clip_f32(float v, float lo, float hi) {
  const float m = v < lo ? lo : v;
  return m > hi ? hi : m;
}

static int activate_f32(float *x, int64_t n, int64_t kind, const float *p) {
  if (kind < 0) return 0;
  const float p0 = p[0], p1 = p[1];
  switch (kind) {
    case 0: for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0.0f || x[i] != x[i] ? x[i] : 0.0f; break;
    case 1: for (int64_t i = 0; i < n; i++) x[i] = clip_f32(x[i], p0, p1); break;
    case 2: for (int64_t i = 0; i < n; i++) x[i] = clip_f32(x[i] * p0 + p1, 0.0f, 1.0f); break;
    case 3: for (int64_t i = 0; i < n; i++) x[i] = x[i] * clip_f32(x[i] * p0 + p1, 0.0f, 1.0f); break;
    default: return -1;
  }
  return 0;
}

int bevir_activation_f32(float *x, const float *p, const int64_t *d) {
  return activate_f32(x, d[0], d[1], p);
}

/* The add a product's result y takes in its own pass (elementwise add, in the add's
 * operand order): y = r + y where first, else y + r, over n elements. */
static void add_residual(float *restrict y, const float *restrict r, int64_t n, int64_t first) {
  if (first)
    for (int64_t i = 0; i < n; i++) y[i] = r[i] + y[i];
  else
    for (int64_t i = 0; i < n; i++) y[i] = y[i] + r[i];
}

/* Channels k.. of depthwise_edge_f32's pixel in vectors V, while a whole one fits. */
#define EDGE_SWEEP(V)                                                                     \
  for (; k + (int64_t)(sizeof(V) / sizeof(float)) <= c; k += sizeof(V) / sizeof(float)) { \
    V a = V##_ld(src[0] + k) * V##_ld(wt + k);                                            \
    for (int64_t t = 1; t < nt; t++) a = a + V##_ld(src[t] + k) * V##_ld(wt + t * c + k); \
    memcpy(o + k, &a, sizeof(V));                                                         \
  }

/* One output pixel of bevir_depthwise_conv_f32 whose window leaves x, tap t's channels
 * read from src[t] (a row of +0 for a tap in the padding: what the padded copy holds, its
 * product computed as any other's): DEPTHWISE_PIXELS' operations for one pixel. */
static void depthwise_edge_f32(const float *const *src, const float *wt, float *o, int64_t c,
                               int64_t nt) {
  int64_t k = 0;
  EDGE_SWEEP(bevir_depthwise_f32_v)
  EDGE_SWEEP(bevir_depthwise_f32_v_h)
  for (; k < c; k++) {
    float a = src[0][k] * wt[k];
    for (int64_t t = 1; t < nt; t++) a = a + src[t][k] * wt[t * c + k];
    o[k] = a;
  }
}

/* x // y for y > 0, rounding down (C's division truncates toward zero). */
static inline int64_t floor_div(int64_t x, int64_t y) { return x >= 0 ? x / y : -((-x + y - 1) / y); }

/* Output pixel (oy, ox) of bevir_depthwise_conv_f32 by depthwise_edge_f32: each tap's row
 * of channels in x, or the row of zeros. */
#define EDGE_PIXEL                                                                        \
  {                                                                                       \
    for (int64_t i = 0, t = 0; i < kh; i++)                                               \
      for (int64_t j = 0; j < kw; j++, t++) {                                             \
        const int64_t iy = iy0 + i * dh, ix = ox * sw - left + j * dw;                    \
        src[t] = iy >= 0 && iy < H && ix >= 0 && ix < W ? img + (iy * W + ix) * c : zeros; \
      }                                                                                   \
    depthwise_edge_f32(src, wt, orow + ox * c, c, nt);                                    \
  }

/* The depthwise convolution of float32 x [N, H, W, C] padded with +0 by top rows and left
 * columns (and below and right as far as the windows reach), without a padded copy: the
 * products and sums of bevir_depthwise_f32 on the padded input, a window within x by
 * DEPTHWISE_PIXELS, one that leaves it by depthwise_edge_f32; then the bias added to each
 * pixel's channels (conv2d's y += b), res (where not NULL; laid out as out) added as
 * add_residual adds it, and activation act (activate_f32). Output rows y0 to
 * y1 of each image of out [N, OH, OW, C]. dims: N, H, W, C, OH, OW, KH, KW, SH, SW, DH, DW,
 * top, left, y0, y1. */
int bevir_depthwise_conv_f32(const float *x, const float *wt, const float *bias, float *out,
                             const int64_t *d, int64_t act, const float *p, const float *res,
                             int64_t res_first) {
  const int64_t N = d[0], H = d[1], W = d[2], c = d[3], OH = d[4], OW = d[5], kh = d[6];
  const int64_t kw = d[7], sh = d[8], sw = d[9], dh = d[10], dw = d[11], top = d[12];
  const int64_t left = d[13], y0 = d[14], y1 = d[15], nt = kh * kw, step = sw * c;
  ptrdiff_t *off = tap_offsets(d);                    /* in x's rows of W pixels */
  const float **src = malloc(sizeof(float *) * (size_t)nt);  /* an edge pixel's taps */
  float *zeros = calloc((size_t)(c > 0 ? c : 1), sizeof(float));
  if (!off || !src || !zeros) {
    free(off);
    free(src);
    free(zeros);
    return -1;
  }
  /* the output columns [x0, x1) whose windows lie within x's columns */
  const int64_t first = (left + sw - 1) / sw, x0 = first < OW ? first : OW;
  const int64_t last = floor_div(W - 1 - (kw - 1) * dw + left, sw) + 1;
  const int64_t x1 = last < x0 ? x0 : last < OW ? last : OW;
  for (int64_t b = 0; b < N; b++) {
    const float *img = x + b * H * W * c;
    for (int64_t oy = y0; oy < y1; oy++) {
      const int64_t iy0 = oy * sh - top;
      float *orow = out + (b * OH + oy) * OW * c;
      int64_t ox = 0;
      if (iy0 >= 0 && iy0 + (kh - 1) * dh < H) {
        for (; ox < x0; ox++) EDGE_PIXEL
        for (; ox + 4 <= x1; ox += 4) {
          const float *s = img + (iy0 * W + ox * sw - left) * c;
          float *o = orow + ox * c;
          DEPTHWISE_PIXELS(bevir_depthwise_f32_v, float, 4)
        }
        for (; ox < x1; ox++) {
          const float *s = img + (iy0 * W + ox * sw - left) * c;
          float *o = orow + ox * c;
          DEPTHWISE_PIXELS(bevir_depthwise_f32_v, float, 1)
        }
      }
      for (; ox < OW; ox++) EDGE_PIXEL
    }
  }
  free(off);
  free(src);
  free(zeros);
  for (int64_t b = 0; b < N; b++) {
    float *rows = out + (b * OH + y0) * OW * c;
    const int64_t n = (y1 - y0) * OW * c;
    if (bias)
      for (int64_t i = 0; i < n; i += c)
        for (int64_t k = 0; k < c; k++) rows[i + k] = rows[i + k] + bias[k];
    if (res) add_residual(rows, res + (rows - out), n, res_first);
    if (activate_f32(rows, n, act, p) != 0) return -1;
  }
  return 0;
}

/* Float32 products summed as an FMA kernel of BLAS sums them: out[m, n] = the products
 * a[rows[m] + offs[k]] * b[k, n], fused-multiply-added onto +0 in k order (one rounding a
 * step), then + bias[n] (a separate add) where bias is not NULL. The rows of A are gathered
 * through rows and offs, so a convolution runs without its im2col copy: rows[m] is output
 * pixel m's first window element in the padded input, offs[k] tap k's distance from it.
 * dims[7], where not 0, writes out transposed, element (m, n) at out[n * dims[7] + m] (a
 * convolution's result channel by channel; one group, one block of the reduction).
 * The reduction runs in blocks, k from kb[i] to kb[i + 1] for i < NB, each block's sum
 * fused-multiply-added onto +0 and the blocks' sums added in order: BLAS's blocks of a
 * long reduction (native.blas_blocks), or one block of all K.
 * b: [K, N] row-major; out: [M, N], rows ldo apart. dims: M, N, K, ldo, G, S, NB: a grouped
 * convolution makes G such products, group g reading A's elements g * S further on, b and
 * bias g * K * N and g * N further on, writing out's columns g * N on (ldo = G * N); res,
 * where not NULL, laid out as out, is added to each result after the bias (res + y where
 * res_first, else y + res: an add that reads the product, in its operand order; not with
 * out transposed); then activation act (activate_f32, its parameters p) over out. The caller uses it only where
 * it has found BLAS to give the same bits (native.agrees).
 * A tile of R rows x V vectors of 16 columns keeps its R * V accumulators in registers
 * (constant indices: a variable one would spill them) while a strip of b stays in cache:
 * 6 x 4 tiles over strips of 64 columns, 4 x 2 ones over what is left in strips of 32,
 * 8 x 1 ones over the last 16 or fewer columns, so few lanes are wasted. Returns -1 where the build has no AVX-512. */
#ifdef __AVX512F__
#define UNROLL _Pragma("GCC unroll 8")

/* 16 lanes to q, q + cols, ... (out transposed: column c at out + c * cols); not inlined,
 * so that its index vector takes no register from a tile's loop */
static __attribute__((noinline)) void store_transposed(float *q, __mmask16 mask, __m512 t,
                                                       int64_t cols) {
  const __m512i lanes = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      _mm512_set1_epi32((int)cols));
  _mm512_mask_i32scatter_ps(q, mask, lanes, t, 4);
}

#define GATHER_GEMM_TILES(R, V)                                                           \
  static void gather_gemm_##R##x##V(const float *a, const int64_t *rows,                  \
                                    const int64_t *offs, const float *b,                  \
                                    const float *bias, float *out, const int64_t *d,      \
                                    const int64_t *kb, int64_t n0, int64_t n1,            \
                                    const float *res, int64_t first) {                    \
    const int64_t M = d[0], N = d[1], ldo = d[3], nb = d[6], cols = d[7];                 \
    for (int64_t n = n0; n < n1; n += 16 * V) {                                           \
      __mmask16 mask[V];                                                                  \
      __m512 add[V];                                                                      \
      UNROLL for (int j = 0; j < V; j++) {                                                \
        const int64_t left = n1 - n - 16 * j;                                             \
        mask[j] = left <= 0 ? 0 : left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);    \
        add[j] = bias ? _mm512_maskz_loadu_ps(mask[j], bias + n + 16 * j)                 \
                      : _mm512_setzero_ps();                                              \
      }                                                                                   \
      for (int64_t m = 0; m < M; m += R) {                                                \
        const int live = M - m < R ? (int)(M - m) : R;                                    \
        const float *ar[R];                                                               \
        UNROLL for (int r = 0; r < R; r++) ar[r] = a + rows[m + (r < live ? r : 0)];      \
        for (int64_t blk = 0; blk < nb; blk++) {                                          \
          __m512 s[R][V];                                                                 \
          UNROLL for (int r = 0; r < R; r++)                                              \
            UNROLL for (int j = 0; j < V; j++) s[r][j] = _mm512_setzero_ps();             \
          const int64_t k1 = kb[blk + 1];                                                 \
          for (int64_t k = kb[blk]; k < k1; k++) {                                        \
            __m512 w[V];                                                                  \
            UNROLL for (int j = 0; j < V; j++)                                            \
              w[j] = _mm512_maskz_loadu_ps(mask[j], b + k * N + n + 16 * j);              \
            const int64_t o = offs[k];                                                    \
            UNROLL for (int r = 0; r < R; r++) {                                          \
              const __m512 v = _mm512_set1_ps(ar[r][o]);                                  \
              UNROLL for (int j = 0; j < V; j++) s[r][j] = _mm512_fmadd_ps(v, w[j], s[r][j]); \
            }                                                                             \
          }                                                                               \
          /* the blocks' sums add up in out, then the bias */                             \
          const int last = blk == nb - 1;                                                 \
          UNROLL for (int r = 0; r < R; r++)                                              \
            if (r < live)                                                                 \
              UNROLL for (int j = 0; j < V; j++) {                                        \
                float *q = out + (m + r) * ldo + n + 16 * j;                              \
                __m512 t = blk ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask[j], q), s[r][j]) \
                               : s[r][j];                                                 \
                if (last && bias) t = _mm512_add_ps(t, add[j]);                           \
                if (last && res) {                                                        \
                  const __m512 r = _mm512_maskz_loadu_ps(mask[j], res + (q - out));       \
                  t = first ? _mm512_add_ps(r, t) : _mm512_add_ps(t, r);                  \
                }                                                                         \
                if (cols)                                                                 \
                  store_transposed(out + (n + 16 * j) * cols + m + r, mask[j], t, cols);  \
                else                                                                      \
                  _mm512_mask_storeu_ps(q, mask[j], t);                                   \
              }                                                                           \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }
GATHER_GEMM_TILES(6, 4)
GATHER_GEMM_TILES(4, 2)
GATHER_GEMM_TILES(8, 1)
#endif

int bevir_gather_gemm_f32(const float *a, const int64_t *rows, const int64_t *offs,
                          const float *b, const float *bias, float *out, const int64_t *d,
                          const int64_t *kb, int64_t act, const float *p, const float *res,
                          int64_t res_first) {
#ifdef __AVX512F__
  const int64_t N = d[1], K = d[2], n64 = N / 64 * 64, rest = N - n64;
  const int64_t n32 = n64 + (rest % 32 > 16 ? rest : rest / 32 * 32);
  if (res && d[7]) return -1;                  /* no addend to a result written transposed */
  for (int64_t g = 0; g < d[4]; g++) {
    const float *ag = a + g * d[5], *bg = b + g * K * N, *biasg = bias ? bias + g * N : bias;
    float *og = out + g * N;
    const float *rg = res ? res + g * N : res;
    gather_gemm_6x4(ag, rows, offs, bg, biasg, og, d, kb, 0, n64, rg, res_first);
    gather_gemm_4x2(ag, rows, offs, bg, biasg, og, d, kb, n64, n32, rg, res_first);
    gather_gemm_8x1(ag, rows, offs, bg, biasg, og, d, kb, n32, N, rg, res_first);
  }
  return activate_f32(out, d[0] * d[3], act, p);
#else
  (void)a; (void)rows; (void)offs; (void)b; (void)bias; (void)out; (void)d; (void)kb;
  (void)act; (void)p; (void)res; (void)res_first;
  return -1;
#endif
}

/* Bilinear resize (kernels.resize.resize_bilinear_f32: onnxruntime's UpsampleBilinear), x viewed as
 * [outer, H, W, inner]: out[o, y, x, i] = ((wy2[y] * wx2[x]) * x[o, yl, xl, i]
 * + (wy2[y] * wx1[x]) * x[o, yl, xh, i]) + (wy1[y] * wx2[x]) * x[o, yh, xl, i]
 * + (wy1[y] * wx1[x]) * x[o, yh, xh, i], each product and sum rounded in that order.
 * taps: yl, yh [OH], xl, xh [OW]; weights: wy1, wy2 [OH], wx1, wx2 [OW]. dims: outer, H, W,
 * inner, OH, OW. The loop over the inner (contiguous) elements is the vector one. */
int bevir_resize_bilinear_f32(const float *x, const int64_t *taps, const float *weights,
                              float *out, const int64_t *d) {
  const int64_t outer = d[0], H = d[1], W = d[2], inner = d[3], OH = d[4], OW = d[5];
  const int64_t *yl = taps, *yh = taps + OH, *xl = taps + 2 * OH, *xh = taps + 2 * OH + OW;
  const float *wy1 = weights, *wy2 = weights + OH, *wx1 = weights + 2 * OH,
              *wx2 = weights + 2 * OH + OW;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t y = 0; y < OH; y++) {
      const float *r0 = x + (o * H + yl[y]) * W * inner, *r1 = x + (o * H + yh[y]) * W * inner;
      for (int64_t c = 0; c < OW; c++) {
        const float w00 = wx2[c] * wy2[y], w01 = wx1[c] * wy2[y], w10 = wx2[c] * wy1[y],
                    w11 = wx1[c] * wy1[y];
        const float *a = r0 + xl[c] * inner, *b = r0 + xh[c] * inner, *e = r1 + xl[c] * inner,
                    *f = r1 + xh[c] * inner;
        float *q = out + ((o * OH + y) * OW + c) * inner;
        for (int64_t i = 0; i < inner; i++) q[i] = w00 * a[i] + w01 * b[i] + w10 * e[i] + w11 * f[i];
      }
    }
  return 0;
}

/* Transposition of the last two axes: out[o, j, i] = x[o, i, j] for x [outer, A, B] of
 * elements of one width (the bits move unchanged), in 16 x 16 tiles so that both the reads
 * and the writes stay within a few cache lines (a layout change with few channels: NCHW to
 * NHWC is [N, C, H*W] to [N, H*W, C]); fewer than 16 columns, row by row. Up to 8 rows
 * (an image's 3 channels, a channel shuffle's pairs) interleave in one sweep, the row count
 * a constant in each case so that the compiler vectorizes it. dims: outer, A, B. */
#define TRANSPOSE(NAME, T)                                                                \
  static inline __attribute__((always_inline)) void NAME##_few(const T *x, T *out,        \
                                                               int64_t A, int64_t B) {    \
    for (int64_t j = 0; j < B; j++)                                                       \
      for (int64_t i = 0; i < A; i++) out[j * A + i] = x[i * B + j];                      \
  }                                                                                       \
  int NAME(const T *x, T *out, const int64_t *d) {                                        \
    const int64_t outer = d[0], A = d[1], B = d[2];                                       \
    for (int64_t o = 0; o < outer; o++, x += A * B, out += A * B)                         \
      switch (A) {                                                                        \
        case 1: NAME##_few(x, out, 1, B); break;                                          \
        case 2: NAME##_few(x, out, 2, B); break;                                          \
        case 3: NAME##_few(x, out, 3, B); break;                                          \
        case 4: NAME##_few(x, out, 4, B); break;                                          \
        case 5: NAME##_few(x, out, 5, B); break;                                          \
        case 6: NAME##_few(x, out, 6, B); break;                                          \
        case 7: NAME##_few(x, out, 7, B); break;                                          \
        case 8: NAME##_few(x, out, 8, B); break;                                          \
        default:                                                                          \
          if (B < 16) /* a few long output rows: each written in one sweep */             \
            NAME##_few(x, out, A, B);                                                     \
          else                                                                            \
            for (int64_t i0 = 0; i0 < A; i0 += 16)                                        \
              for (int64_t j0 = 0; j0 < B; j0 += 16) {                                    \
                const int64_t i1 = i0 + 16 < A ? i0 + 16 : A, j1 = j0 + 16 < B ? j0 + 16 : B; \
                for (int64_t j = j0; j < j1; j++)                                         \
                  for (int64_t i = i0; i < i1; i++) out[j * A + i] = x[i * B + j];        \
              }                                                                           \
      }                                                                                   \
    return 0;                                                                             \
  }

TRANSPOSE(bevir_transpose_u8, uint8_t)
TRANSPOSE(bevir_transpose_u16, uint16_t)
TRANSPOSE(bevir_transpose_u32, uint32_t)
TRANSPOSE(bevir_transpose_u64, uint64_t)

/* GELU, erf form (elementwise._gelu, _erf): the float64 arithmetic of numpy's code in the
 * same order, in two passes around its exp (whose results only numpy gives). k: sqrt(2),
 * the erfc polynomial's leading coefficient, its 8 next ones, and its constant term.
 * gelu_erf_a: per float32 x, u = x / sqrt(2), z = |u|, t = 1 / (1 + z * 0.5), the Horner
 * sum acc, and e = -(z * z) - constant + acc, the exponent (written in e, t in t).
 * gelu_erf_b: after e = exp(e): erfc = e * t, s = copysign(1, u + 0), erf = s - erfc * s,
 * out = (float)((0.5 * x) * (1 + erf)). dims: n. */
int bevir_gelu_erf_a_f32(const float *restrict x, double *restrict e, double *restrict t,
                         const int64_t *d, const double *restrict k) {
  for (int64_t i = 0; i < d[0]; i++) {
    const double z = fabs((double)x[i] / k[0]);
    double ti = z * 0.5;
    ti = ti + 1.0;
    ti = 1.0 / ti;
    double acc = ti * k[1];
    for (int j = 2; j < 10; j++) {
      acc = acc + k[j];
      acc = acc * ti;
    }
    double p = -(z * z);
    p = p - k[10];
    e[i] = p + acc;
    t[i] = ti;
  }
  return 0;
}

int bevir_gelu_erf_b_f32(const float *restrict x, const double *restrict e,
                         const double *restrict t, float *restrict out, const int64_t *d,
                         const double *restrict k) {
  for (int64_t i = 0; i < d[0]; i++) {
    const double xd = (double)x[i], u = xd / k[0];
    const double s = copysign(1.0, u + 0.0);
    double erfc = e[i] * t[i];
    erfc = erfc * s;
    const double erf = s - erfc;
    out[i] = (float)((0.5 * xd) * (1.0 + erf));
  }
  return 0;
}

/* Sigmoid and SiLU (elementwise._sigmoid, Silu) of float32, in two passes around numpy's
 * exp: sigmoid_a writes e = -|x|; after e = exp(e), sigmoid_b writes, with d = e + 1 and
 * m = maximum(e, x >= 0 ? 1 : 0) as numpy's maximum takes it (e kept where greater or a
 * NaN), out = m / d, times x where silu. dims: n, silu. */
int bevir_sigmoid_a_f32(const float *restrict x, float *restrict e, const int64_t *d) {
  for (int64_t i = 0; i < d[0]; i++) e[i] = -fabsf(x[i]);
  return 0;
}

int bevir_sigmoid_b_f32(const float *restrict x, const float *restrict e, float *restrict out,
                        const int64_t *d) {
  for (int64_t i = 0; i < d[0]; i++) {
    const float one = x[i] >= 0.0f ? 1.0f : 0.0f, den = e[i] + 1.0f;
    const float m = e[i] > one || e[i] != e[i] ? e[i] : one, s = m / den;
    out[i] = d[1] ? x[i] * s : s;
  }
  return 0;
}

/* numpy's float32 add.reduce of a contiguous run of n: its pairwise sum (from +0 below 8
 * elements; 8 accumulators up to 128, their sums paired; halves of a multiple of 8 above). */
static float pairwise_sum_f32(const float *a, int64_t n) {
  if (n < 8) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s = s + a[i];
    return s;
  }
  if (n <= 128) {
    float r[8];
    int64_t i;
    for (int j = 0; j < 8; j++) r[j] = a[j];
    for (i = 8; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; j++) r[j] = r[j] + a[i + j];
    float s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) s = s + a[i];
    return s;
  }
  int64_t half = n / 2;
  half -= half % 8;
  return pairwise_sum_f32(a, half) + pairwise_sum_f32(a + half, n - half);
}

/* Layer normalization of rows of c float32 (kernels.norm's numpy code): mean = (0 + the row's
 * sum) / c, d = x - mean, var = (0 + the sum of d * d) / c, each sum numpy's
 * (pairwise_sum_f32), out = d / sqrt(var + eps), then * scale[k] and + bias[k] where not NULL.
 * dims: rows, c. Returns -1 (having written nothing) where no memory is left for the squares. */
int bevir_layer_norm_f32(const float *x, const float *scale, const float *bias, float *out,
                         const int64_t *d, const float *eps) {
  const int64_t rows = d[0], c = d[1];
  float *sq = malloc(sizeof(float) * (size_t)(c > 0 ? c : 1));
  if (!sq) return -1;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c;
    float *o = out + r * c;
    const float mean = (0.0f + pairwise_sum_f32(xr, c)) / (float)c;
    for (int64_t k = 0; k < c; k++) {
      o[k] = xr[k] - mean;
      sq[k] = o[k] * o[k];
    }
    const float var = (0.0f + pairwise_sum_f32(sq, c)) / (float)c;
    const float s = sqrtf(var + eps[0]);
    for (int64_t k = 0; k < c; k++) o[k] = o[k] / s;
    if (scale)
      for (int64_t k = 0; k < c; k++) o[k] = o[k] * scale[k];
    if (bias)
      for (int64_t k = 0; k < c; k++) o[k] = o[k] + bias[k];
  }
  free(sq);
  return 0;
}

/* onnxruntime's float GlobalAveragePool (kernels.pool.mlas_global_mean) of x [N, S, C] where
 * channels_last, else [N, C, S]: per image and channel, four lanes, lane j the sum of
 * elements j, j + 4, ... in order onto +0 (as numpy's add.reduce adds row after row from its
 * identity), the lanes added as (l0 + l2) + (l1 + l3), the last S % 4 elements added one by
 * one, the sum divided by S. out: [N, C]. dims: N, S, C, channels_last. lanes: 4 * C floats
 * of scratch (channels last). */
int bevir_global_mean_f32(const float *x, float *out, float *lanes, const int64_t *d) {
  const int64_t N = d[0], S = d[1], C = d[2], body = S - S % 4;
  for (int64_t n = 0; n < N; n++, x += S * C, out += C) {
    if (d[3]) {
      /* four rows of channels, one a lane, lie as the lanes do: one run of 4 * C adds */
      for (int64_t k = 0; k < 4 * C; k++) lanes[k] = 0.0f;
      for (int64_t i = 0; i < body; i += 4) {
        const float *restrict rows = x + i * C;
        float *restrict l = lanes;
        for (int64_t k = 0; k < 4 * C; k++) l[k] = l[k] + rows[k];
      }
      for (int64_t c = 0; c < C; c++) {
        float total = (lanes[c] + lanes[2 * C + c]) + (lanes[C + c] + lanes[3 * C + c]);
        for (int64_t i = body; i < S; i++) total = total + x[i * C + c];
        out[c] = total / (float)S;
      }
    } else {
      for (int64_t c = 0; c < C; c++) {
        const float *row = x + c * S;
        float l[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t i = 0; i < body; i += 4)
          for (int j = 0; j < 4; j++) l[j] = l[j] + row[i + j];
        float total = (l[0] + l[2]) + (l[1] + l[3]);
        for (int64_t i = body; i < S; i++) total = total + row[i];
        out[c] = total / (float)S;
      }
    }
  }
  return 0;
}

/* Inference batch norm of float32 (kernels.norm.batch_norm's numpy code) over x [outer, C,
 * inner]: out = (x - mean[c]) / s[c] * scale[c] + bias[c], each operation rounded in that
 * order, s = sqrt(var + eps) given. p: mean, s, scale, bias, C floats each. dims: outer,
 * C, inner. */
int bevir_batch_norm_f32(const float *x, const float *p, float *out, const int64_t *d) {
  const int64_t outer = d[0], C = d[1], inner = d[2];
  const float *mean = p, *s = p + C, *k = p + 2 * C, *b = p + 3 * C;
  for (int64_t o = 0; o < outer; o++, x += C * inner, out += C * inner) {
    if (inner == 1) { /* channels last: one run of the channels */
      for (int64_t c = 0; c < C; c++) out[c] = (x[c] - mean[c]) / s[c] * k[c] + b[c];
      continue;
    }
    for (int64_t c = 0; c < C; c++) {
      const float m = mean[c], sc = s[c], kc = k[c], bc = b[c];
      const float *xc = x + c * inner;
      float *oc = out + c * inner;
      for (int64_t i = 0; i < inner; i++) oc[i] = (xc[i] - m) / sc * kc + bc;
    }
  }
  return 0;
}

/* Concatenation along an axis of C-contiguous arrays, as bytes: out's row r (of d[0]) is
 * row r of each of the d[1] operands xs[i] (rows of widths[i] bytes), one after the other:
 * the bits move unchanged. numpy copies runs of a few channels (an NHWC concatenation)
 * element by element, slowly. Operand by operand, each run in fixed-size moves (the last
 * one overlapping the one before where the run is no multiple of its size): a call of
 * memcpy per short run costs more than the run, and GCC would make the loop one (the
 * attribute keeps it from). dims: rows, operands. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
int bevir_join_rows(const char *const *xs, const int64_t *widths, char *out, const int64_t *d) {
  const int64_t rows = d[0], n = d[1];
  int64_t row = 0;
  for (int64_t i = 0; i < n; i++) row += widths[i];
  for (int64_t i = 0, at = 0; i < n; at += widths[i], i++) {
    const int64_t w = widths[i];
    for (int64_t r = 0; r < rows; r++) {
      char *restrict dst = out + at + r * row;
      const char *restrict src = xs[i] + r * w;
      if (w >= 32) {
        int64_t k = 0;
        for (; k + 32 <= w; k += 32) memcpy(dst + k, src + k, 32);
        if (k < w) memcpy(dst + w - 32, src + w - 32, 32);
      } else if (w >= 16) {
        memcpy(dst, src, 16);
        memcpy(dst + w - 16, src + w - 16, 16);
      } else if (w >= 8) {
        memcpy(dst, src, 8);
        memcpy(dst + w - 8, src + w - 8, 8);
      } else if (w >= 4) {
        memcpy(dst, src, 4);
        memcpy(dst + w - 4, src + w - 4, 4);
      } else {
        for (int64_t k = 0; k < w; k++) dst[k] = src[k];
      }
    }
  }
  return 0;
}
