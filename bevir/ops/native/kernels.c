/* Native kernels of the golden model (bevir/ops/native/__init__.py). Each performs the
 * IEEE operations of the numpy code it stands in for, in the same order: built with
 * -ffp-contract=off and without fast math, a multiply and an add round separately. */
#include <stddef.h>
#include <string.h>

/* Depthwise convolution, NHWC: out[b, y, x, c] = sum over taps t in (kh, kw) order of
 * xp[b, y*sh + i*dh, x*sw + j*dw, c] * wt[t, c], the first product stored, each next one
 * added (linalg.depthwise_conv_nhwc). xp is padded, all arrays C-contiguous.
 * dims: n, hp, wp, c, oh, ow, kh, kw, sh, sw, dh, dw. */
#define DEPTHWISE(NAME, T, LANES)                                                         \
  typedef T NAME##_v __attribute__((vector_size(32), aligned(sizeof(T))));                \
  static inline NAME##_v NAME##_ld(const T *p) { NAME##_v v; memcpy(&v, p, 32); return v; } \
  void NAME(const T *xp, const T *wt, T *out, const long *d) {                            \
    long n = d[0], hp = d[1], wp = d[2], c = d[3], oh = d[4], ow = d[5], kh = d[6],       \
         kw = d[7], sh = d[8], sw = d[9], dh = d[10], dw = d[11], nt = kh * kw;           \
    ptrdiff_t off[nt];                                                                    \
    for (long t = 0; t < nt; t++) off[t] = ((t / kw) * dh * wp + (t % kw) * dw) * c;      \
    for (long b = 0; b < n; b++)                                                          \
      for (long y = 0; y < oh; y++)                                                       \
        for (long x = 0; x < ow; x++) {                                                   \
          T *o = out + ((b * oh + y) * ow + x) * c;                                       \
          const T *s = xp + ((b * hp + y * sh) * wp + x * sw) * c;                        \
          long k = 0;                                                                     \
          for (; k + 4 * LANES <= c; k += 4 * LANES) { /* four vectors in registers */    \
            NAME##_v a[4];                                                                \
            for (int v = 0; v < 4; v++)                                                   \
              a[v] = NAME##_ld(s + k + v * LANES) * NAME##_ld(wt + k + v * LANES);        \
            for (long t = 1; t < nt; t++)                                                 \
              for (int v = 0; v < 4; v++)                                                 \
                a[v] = a[v] + NAME##_ld(s + off[t] + k + v * LANES)                       \
                                * NAME##_ld(wt + t * c + k + v * LANES);                  \
            memcpy(o + k, a, sizeof a);                                                   \
          }                                                                               \
          for (; k + LANES <= c; k += LANES) {                                            \
            NAME##_v a = NAME##_ld(s + k) * NAME##_ld(wt + k);                            \
            for (long t = 1; t < nt; t++)                                                 \
              a = a + NAME##_ld(s + off[t] + k) * NAME##_ld(wt + t * c + k);              \
            memcpy(o + k, &a, sizeof a);                                                  \
          }                                                                               \
          for (; k < c; k++) {                                                            \
            T a = s[k] * wt[k];                                                           \
            for (long t = 1; t < nt; t++) a = a + s[off[t] + k] * wt[t * c + k];          \
            o[k] = a;                                                                     \
          }                                                                               \
        }                                                                                 \
  }

DEPTHWISE(bevir_depthwise_f32, float, 8)
DEPTHWISE(bevir_depthwise_f64, double, 4)

/* Max pooling, NHWC: out[b, y, x, c] = the maximum over the window's taps in (kh, kw) order
 * of xp[b, y*sh + i*dh, x*sw + j*dw, c], each next tap v taken as numpy's maximum takes its
 * second operand: m = (m > v || m is NaN) ? m : v (a NaN wins, an equal value replaces m,
 * so maximum(-0, +0) is +0). The select is done on bits, through a mask of I, the integer
 * type of T's width. xp is padded with T's lowest value; dims as above. */
#define MAXPOOL(NAME, T, I)                                                               \
  typedef T NAME##_v __attribute__((vector_size(32), aligned(sizeof(T))));                \
  typedef I NAME##_m __attribute__((vector_size(32), aligned(sizeof(T))));                \
  static inline NAME##_v NAME##_ld(const T *p) { NAME##_v v; memcpy(&v, p, 32); return v; } \
  static inline NAME##_v NAME##_max(NAME##_v m, NAME##_v v) {                             \
    NAME##_m keep = (m > v) | (m != m);                                                   \
    return (NAME##_v)(((NAME##_m)m & keep) | ((NAME##_m)v & ~keep));                     \
  }                                                                                       \
  void NAME(const T *xp, T *out, const long *d) {                                         \
    const long lanes = 32 / sizeof(T);                                                    \
    long n = d[0], hp = d[1], wp = d[2], c = d[3], oh = d[4], ow = d[5], kh = d[6],       \
         kw = d[7], sh = d[8], sw = d[9], dh = d[10], dw = d[11], nt = kh * kw;           \
    ptrdiff_t off[nt];                                                                    \
    for (long t = 0; t < nt; t++) off[t] = ((t / kw) * dh * wp + (t % kw) * dw) * c;      \
    for (long b = 0; b < n; b++)                                                          \
      for (long y = 0; y < oh; y++)                                                       \
        for (long x = 0; x < ow; x++) {                                                   \
          T *o = out + ((b * oh + y) * ow + x) * c;                                       \
          const T *s = xp + ((b * hp + y * sh) * wp + x * sw) * c;                        \
          long k = 0;                                                                     \
          for (; k + lanes <= c; k += lanes) {                                            \
            NAME##_v m = NAME##_ld(s + k);                                                \
            for (long t = 1; t < nt; t++) m = NAME##_max(m, NAME##_ld(s + off[t] + k));   \
            memcpy(o + k, &m, sizeof m);                                                  \
          }                                                                               \
          for (; k < c; k++) {                                                            \
            T m = s[k];                                                                   \
            for (long t = 1; t < nt; t++) {                                               \
              T v = s[off[t] + k];                                                        \
              m = (m > v || m != m) ? m : v;                                              \
            }                                                                             \
            o[k] = m;                                                                     \
          }                                                                               \
        }                                                                                 \
  }

MAXPOOL(bevir_maxpool_f32, float, int)
MAXPOOL(bevir_maxpool_f64, double, long long)
MAXPOOL(bevir_maxpool_i8, signed char, signed char)
MAXPOOL(bevir_maxpool_u8, unsigned char, signed char)
MAXPOOL(bevir_maxpool_i16, short, short)
MAXPOOL(bevir_maxpool_i32, int, int)
