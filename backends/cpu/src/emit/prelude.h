/* tessel cpu backend: what every generated file starts with. Values are held in 32-bit
 * "compute" types (float for f32/f16/bf16, int32_t for signed and bool, uint32_t for unsigned),
 * narrowed after every operation as docs/language.md §8 says; arrays keep their own element
 * types. Compiled without -ffast-math and with -ffp-contract=off: every operation rounds once. */
#include <stdint.h>
#include <string.h>
#include <math.h>

typedef struct tk_ctx {
    void *const *args;    /* one per kernel argument, in declaration order (scratch: NULL) */
    const int64_t *grid;  /* the size of every grid axis */
    /* dst[m x n] (+)= a[m x k] b[k x n], each operand at its (row, column) strides in elements */
    void (*sgemm)(int64_t m, int64_t n, int64_t k, float *dst, int64_t drs, int64_t dcs,
                  const float *a, int64_t ars, int64_t acs, const float *b, int64_t brs, int64_t bcs,
                  int32_t parallel, int32_t accumulate);
    int32_t parallel_dot; /* whether a product may use the pool (few programs) */
    /* part(data, i) for i in [0, parts), spread over the pool; returns when all are done */
    void (*parallel)(void (*part)(void *data, int64_t i), void *data, int64_t parts);
    /* gemm.h's c[m x n] (+)= a b, from the product library (NULL in a launch without a float dot) */
    void (*gemm)(const struct tk_ctx *cx, int64_t m, int64_t n, int64_t k, float *c, int64_t ldc,
                 const float *a, int64_t ars, int64_t acs, const float *b, int64_t ldb, int32_t accumulate);
} tk_ctx;

/* A multiply-add, fused where the machine has the instruction (libm's programs need it neither
 * way; a software fmaf would be slow). */
#ifdef __FMA__
#define TK_FMA(a, b, c) fmaf(a, b, c)
#else
#define TK_FMA(a, b, c) ((a) * (b) + (c))
#endif

static inline uint32_t tk_fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float tk_bitsf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static inline int32_t tk_isnan(float x) { return (tk_fbits(x) & 0x7fffffffu) > 0x7f800000u; }

/* The nearest f16 (ties to even) of x, as a float. */
static inline float tk_rf16(float x) {
    uint32_t b = tk_fbits(x), s = b & 0x80000000u, a = b & 0x7fffffffu;
    float q = (fabsf(x) + 0.5f) - 0.5f; /* subnormal f16: a multiple of 2^-24 */
    uint32_t n = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
    uint32_t r = a < 0x38800000u ? tk_fbits(q) : n;
    r = a >= 0x477ff000u ? 0x7f800000u : r;
    return a > 0x7f800000u ? x : tk_bitsf(s | r);
}

/* The nearest bf16 (ties to even) of x, as a float. */
static inline float tk_rbf16(float x) {
    uint32_t b = tk_fbits(x);
    float r = tk_bitsf((b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u);
    return (b & 0x7fffffffu) > 0x7f800000u ? x : r;
}

/* f16 bits to float, exactly. */
static inline float tk_h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float sub = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
    uint32_t norm = e == 31u ? (0x7f800000u | (m << 13)) : (((e + 112u) << 23) | (m << 13));
    return e == 0u ? tk_bitsf(s | tk_fbits(sub)) : tk_bitsf(s | norm);
}

/* The f16 bits of a float that is an f16 value (tk_rf16 made it one); NaN stays NaN. */
static inline uint16_t tk_f2h(float x) {
    uint32_t b = tk_fbits(x), s = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
    uint32_t sub = (uint32_t)(fabsf(x) * 16777216.0f); /* 2^24: exact for f16 subnormals */
    uint32_t norm = ((a >> 13) - (112u << 10)) & 0x7fffu;
    uint32_t r = a < 0x38800000u ? sub : norm;
    r = a >= 0x7f800000u ? (a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u) : r;
    return (uint16_t)(s | r);
}

static inline float tk_b2f(uint16_t h) { return tk_bitsf((uint32_t)h << 16); }
static inline uint16_t tk_f2b(float x) { return (uint16_t)(tk_fbits(x) >> 16); }

/* max and min that propagate NaN (jnp.maximum), as the interpreter folds them. */
static inline float tk_max(float a, float b) { return a > b ? a : (b >= a ? b : a + b); }
static inline float tk_min(float a, float b) { return a < b ? a : (b <= a ? b : a + b); }

/* Float to integer: toward zero, saturating, NaN gives 0. */
static inline int32_t tk_f2i(float x) {
    int32_t v = (int32_t)fminf(fmaxf(x, -2147483648.0f), 2147483520.0f);
    v = x >= 2147483648.0f ? 2147483647 : v;
    return tk_isnan(x) ? 0 : v;
}
static inline uint32_t tk_f2u(float x) {
    uint32_t v = (uint32_t)(int64_t)fminf(fmaxf(x, 0.0f), 4294967040.0f);
    v = x >= 4294967296.0f ? 4294967295u : v;
    return tk_isnan(x) ? 0u : v;
}

static inline int32_t tk_div_i32(int32_t a, int32_t b) {
    return b == 0 ? 0 : (b == -1 ? (int32_t)(0u - (uint32_t)a) : a / b);
}
static inline int32_t tk_rem_i32(int32_t a, int32_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
static inline uint32_t tk_div_u32(uint32_t a, uint32_t b) { return b == 0u ? 0u : a / b; }
static inline uint32_t tk_rem_u32(uint32_t a, uint32_t b) { return b == 0u ? 0u : a % b; }
static inline uint32_t tk_mulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
static inline uint32_t tk_clz(uint32_t a) { return a == 0u ? 32u : (uint32_t)__builtin_clz(a); }

/* Block indices that are computed (docs/language.md §2): floor division and modulo, 0 for 0. */
static inline int32_t tk_ifloordiv(int32_t a, int32_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int32_t)(0u - (uint32_t)a);
    int32_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int32_t tk_ifloormod(int32_t a, int32_t b) {
    if (b == 0 || b == -1) return 0;
    int32_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int32_t tk_icdiv(int32_t a, int32_t b) {
    return (int32_t)((uint32_t)tk_ifloordiv(a, b) + (uint32_t)(tk_ifloormod(a, b) != 0));
}
static inline int32_t tk_imin(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t tk_imax(int32_t a, int32_t b) { return a > b ? a : b; }
/* A computed block index brought into 0 ..= blocks - 1: negative counts from the end once. */
static inline int64_t tk_iclamp(int32_t v, int64_t blocks) {
    int64_t b = v < 0 ? (int64_t)v + blocks : (int64_t)v;
    return b < 0 ? 0 : (b > blocks - 1 ? blocks - 1 : b);
}

/* Eight lanes at a time, for row reductions (GCC's and Clang's vector extensions): each lane is
 * one of the eight partial results, so the order of the operations is the scalar lanes' own. */
typedef float tk_v8f __attribute__((vector_size(32)));
typedef int32_t tk_v8i __attribute__((vector_size(32)));
typedef uint32_t tk_v8u __attribute__((vector_size(32)));
static inline tk_v8f tk_v8sel(tk_v8i m, tk_v8f a, tk_v8f b) { return (tk_v8f)(((tk_v8i)a & m) | ((tk_v8i)b & ~m)); }
static inline tk_v8f tk_v8max(tk_v8f a, tk_v8f b) { return tk_v8sel(a > b, a, tk_v8sel(b >= a, b, a + b)); }
static inline tk_v8f tk_v8min(tk_v8f a, tk_v8f b) { return tk_v8sel(a < b, a, tk_v8sel(b <= a, b, a + b)); }
static inline tk_v8i tk_v8imax(tk_v8i a, tk_v8i b) { tk_v8i m = a > b; return (a & m) | (b & ~m); }
static inline tk_v8i tk_v8imin(tk_v8i a, tk_v8i b) { tk_v8i m = a < b; return (a & m) | (b & ~m); }
static inline tk_v8u tk_v8umax(tk_v8u a, tk_v8u b) { tk_v8u m = (tk_v8u)(a > b); return (a & m) | (b & ~m); }
static inline tk_v8u tk_v8umin(tk_v8u a, tk_v8u b) { tk_v8u m = (tk_v8u)(a < b); return (a & m) | (b & ~m); }

/* e^x as y 2^n, for x inside its callers' clamps: n = x / ln 2 rounded (by adding 1.5 * 2^23),
 * y = e^r of the remainder r = x - n ln 2 (Cody-Waite's two-part ln 2) by Cephes' polynomial
 * with fused multiply-adds. tk_tanh_cpu and tk_exp_cpu scale y by 2^n each its own way. */
static inline float tk_exp_reduced(float x, float *n) {
    float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = TK_FMA(-k, 0.693359375f, x);
    r = TK_FMA(-k, -2.12194440e-4f, r);
    float q = 1.9875691500e-4f;
    q = TK_FMA(q, r, 1.3981999507e-3f);
    q = TK_FMA(q, r, 8.3334519073e-3f);
    q = TK_FMA(q, r, 4.1665795894e-2f);
    q = TK_FMA(q, r, 1.6666665459e-1f);
    q = TK_FMA(q, r, 5.0000001201e-1f);
    *n = k;
    return TK_FMA(r * r, q, r) + 1.0f;
}

/* tanh within 2 ulp (docs/language.md §8's bound), written for the CPU: below 0.625 the odd
 * series of plugin-api/src/libm's `tanh` (x + x^3 P(x^2), ten multiply-adds); above it
 * 1 - 2 / (e^(2|x|) + 1), e^(2|x|) by tk_exp_reduced with its 2^n made in the exponent bits
 * (2|x| is clamped to 18, past which the result rounds to 1); the sign copied back
 * (tanh(-0) = -0), NaN passed through. About 30 vector operations where the
 * portable program takes about 80 (it scales 2^n in two steps for the whole float range);
 * tests/cpu.rs sweeps it against f64. */
static inline float tk_tanh_cpu(float x) {
    float a = fabsf(x);
    float z = a * a;
    float p = 9.691538e-5f;
    p = TK_FMA(p, z, -0.00023912912f);
    p = TK_FMA(p, z, 0.0005900274f);
    p = TK_FMA(p, z, -0.0014558344f);
    p = TK_FMA(p, z, 0.003592128f);
    p = TK_FMA(p, z, -0.008863236f);
    p = TK_FMA(p, z, 0.021869488f);
    p = TK_FMA(p, z, -0.053968254f);
    p = TK_FMA(p, z, 0.13333334f);
    p = TK_FMA(p, z, -0.33333334f);
    float small = TK_FMA(a * z, p, a);
    /* (A ternary and a rounding by adding 1.5 * 2^23: GCC 12 does not vectorize this
     * function's loop with fminf and rintf.) */
    float t = 2.0f * a;
    t = t < 18.0f ? t : 18.0f;
    float n;
    float e = tk_exp_reduced(t, &n) * tk_bitsf((uint32_t)((int32_t)n + 127) << 23);
    float large = 1.0f - 2.0f / (e + 1.0f);
    float y = a < 0.625f ? small : large;
    y = tk_bitsf(tk_fbits(y) | (tk_fbits(x) & 0x80000000u));
    return tk_isnan(x) ? x : y;
}

/* e^x within 1 ulp (§8's bound), written for the CPU: tk_exp_reduced (the reduction and
 * polynomial of plugin-api/src/libm's `exp`, with fused multiply-adds), 2^n applied in two halves made in the exponent bits (so that results from the
 * subnormals to the overflow are one rounding of y 2^n); x clamped to [-104, 89], past which the
 * result rounds to 0 or overflows; NaN passed through. About 22 vector operations where the
 * portable program takes about 35; checked against f64 on 1.4e9 arguments of |x| <= 120 (at most
 * 1 ulp) and by tests/cpu.rs. */
static inline float tk_exp_cpu(float x) {
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    float n;
    float y = tk_exp_reduced(xc, &n);
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1, n2 = ni - n1;
    y = (y * tk_bitsf((uint32_t)(n1 + 127) << 23)) * tk_bitsf((uint32_t)(n2 + 127) << 23);
    return tk_isnan(x) ? x : y;
}
