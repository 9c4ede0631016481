/* tessel cpu backend: the product of float blocks inside one program (after prelude.h in the
 * product library, emit::gemm_source, compiled once per machine; kernels call it through
 * tk_ctx.gemm). A block's operands stay in the caches, so nothing is packed but a chunk of b's
 * panel: a call to a packing BLAS costs more than the product itself at 64^3 (the `gemm` crate,
 * called back through tk_ctx.sgemm, is kept for products past 128^3).
 *
 * c[m x n] (+)= a[m x k] b[k x n]: a at any (row, column) strides, b's and c's rows ldb and ldc
 * apart. Register tiles of TK_MR rows by TK_NV vectors of TK_VW floats (8 x 32 with AVX-512: 16
 * accumulators), each a broadcast element of a times a row of b, summed along k with fused
 * multiply-adds in order (the language leaves the order of a product's sums open, §8); k in
 * chunks of TK_KC, each chunk of a whole panel of b copied to consecutive rows first. Columns
 * past the last whole panel by tiles of one vector, past the last whole vector one by one. */
#if defined(__AVX512F__)
#define TK_VW 16
#elif defined(__AVX__)
#define TK_VW 8
#else
#define TK_VW 4
#endif
#if defined(__AVX512F__) || defined(__aarch64__)
#define TK_MR 8 /* 32 vector registers */
#else
#define TK_MR 4 /* 16 */
#endif
#define TK_NV 2
#define TK_KC 256
typedef float tk_vf __attribute__((vector_size(TK_VW * 4)));
typedef float tk_vfu __attribute__((vector_size(TK_VW * 4), aligned(4)));

/* The file is compiled with -ffp-contract=off; these functions alone contract a * b + c into one
 * multiply-add (GCC: the optimize pragma; Clang: the standard pragma inside each body). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif

/* c[R x V vectors] (+)= a b over k, R and V constants where it is inlined. */
static inline __attribute__((always_inline)) void tk_gemm_tile(int R, int V, int64_t k, float *restrict c,
        int64_t ldc, const float *restrict a, int64_t ars, int64_t acs, const float *restrict b, int64_t ldb,
        int accumulate) {
#ifdef __clang__
#pragma STDC FP_CONTRACT ON
#endif
    tk_vf acc[TK_MR][TK_NV];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) acc[r][v] = accumulate ? *(const tk_vfu *)&c[r * ldc + v * TK_VW] : (tk_vf){0};
    for (int64_t q = 0; q < k; q++) {
        tk_vf bv[TK_NV];
        for (int v = 0; v < V; v++) bv[v] = *(const tk_vfu *)&b[q * ldb + v * TK_VW];
        for (int r = 0; r < R; r++) {
            float s = a[r * ars + q * acs];
            for (int v = 0; v < V; v++) acc[r][v] += s * bv[v];
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) *(tk_vfu *)&c[r * ldc + v * TK_VW] = acc[r][v];
}

/* Every row of the panel of V vectors at column j (its rows of b at bj, ldbj apart), over the
 * chunk of k. */
#define TK_GEMM_ROWS(V, bj, ldbj)                                                                   \
    do {                                                                                            \
        int64_t i = 0;                                                                              \
        for (; i + TK_MR <= m; i += TK_MR)                                                          \
            tk_gemm_tile(TK_MR, V, kc, c + i * ldc + j, ldc, a + i * ars, ars, acs, bj, ldbj, acc); \
        for (; i + 4 <= m; i += 4)                                                                  \
            tk_gemm_tile(4, V, kc, c + i * ldc + j, ldc, a + i * ars, ars, acs, bj, ldbj, acc);     \
        for (; i < m; i++)                                                                          \
            tk_gemm_tile(1, V, kc, c + i * ldc + j, ldc, a + i * ars, ars, acs, bj, ldbj, acc);     \
    } while (0)

static void tk_sgemm(int64_t m, int64_t n, int64_t k, float *restrict c, int64_t ldc, const float *restrict a,
        int64_t ars, int64_t acs, const float *restrict b, int64_t ldb, int accumulate) {
#ifdef __clang__
#pragma STDC FP_CONTRACT ON
#endif
    /* A whole panel's chunk of b copied to consecutive rows: the tiles then read it in order,
     * where rows a power of two apart (a tile of a 512-wide array) would share a few cache sets. */
    float panel[TK_KC * TK_NV * TK_VW] __attribute__((aligned(64)));
    int64_t q0 = 0;
    do { /* at least once: k = 0 writes zeros (or keeps c) */
        int64_t kc = k - q0 < TK_KC ? k - q0 : TK_KC;
        int acc = accumulate || q0 > 0;
        int64_t j = 0;
        for (; j + TK_NV * TK_VW <= n; j += TK_NV * TK_VW) {
            for (int64_t q = 0; q < kc; q++)
                for (int v = 0; v < TK_NV; v++)
                    *(tk_vf *)&panel[(q * TK_NV + v) * TK_VW] = *(const tk_vfu *)&b[q * ldb + j + v * TK_VW];
            TK_GEMM_ROWS(TK_NV, panel, TK_NV * TK_VW);
        }
        for (; j + TK_VW <= n; j += TK_VW) TK_GEMM_ROWS(1, b + j, ldb);
        for (; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                float s = acc ? c[i * ldc + j] : 0.0f;
                for (int64_t q = 0; q < kc; q++) s += a[i * ars + q * acs] * b[q * ldb + j];
                c[i * ldc + j] = s;
            }
        a += kc * acs;
        b += kc * ldb;
        q0 += kc;
    } while (q0 < k);
}
#undef TK_GEMM_ROWS

/* A product split by rows over the pool (a grid of fewer programs than workers: megablox's
 * sequential grid): parts of TK_PART_ROWS rows, each by tk_sgemm. */
#define TK_PART_ROWS 32
typedef struct tk_gemm_job {
    int64_t m, n, k, ldc, ars, acs, ldb;
    float *c;
    const float *a, *b;
    int accumulate;
} tk_gemm_job;

static void tk_gemm_part(void *data, int64_t i) {
    const tk_gemm_job *j = (const tk_gemm_job *)data;
    int64_t r0 = i * TK_PART_ROWS, rows = j->m - r0 < TK_PART_ROWS ? j->m - r0 : TK_PART_ROWS;
    tk_sgemm(rows, j->n, j->k, j->c + r0 * j->ldc, j->ldc, j->a + r0 * j->ars, j->ars, j->acs, j->b, j->ldb, j->accumulate);
}

/* tk_sgemm, over the pool where the kernel lets products use it and there are rows to split. */
static void tk_sgemm_pool(const tk_ctx *cx, int64_t m, int64_t n, int64_t k, float *c, int64_t ldc, const float *a,
        int64_t ars, int64_t acs, const float *b, int64_t ldb, int accumulate) {
    if (!cx->parallel_dot || m < 2 * TK_PART_ROWS || m * n * k < (1 << 18)) {
        tk_sgemm(m, n, k, c, ldc, a, ars, acs, b, ldb, accumulate);
        return;
    }
    tk_gemm_job job = {m, n, k, ldc, ars, acs, ldb, c, a, b, accumulate};
    cx->parallel(tk_gemm_part, &job, (m + TK_PART_ROWS - 1) / TK_PART_ROWS);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
