/*
 * Host BFP kernel: the float32 quantize, the pack and the unpack of host.numerics.bfp,
 * in plain C99.
 *
 * No Python API: host/numerics/_ckernel.py compiles this file with gcc and loads it with
 * ctypes. The results are those of bfp._quantize_reference, bfp._pack_reference and the
 * NumPy unpack bit for bit (tests/numerics/test_bfp_ckernel.py); docs/numerics.md section 2
 * is the definition.
 *
 * Floating point. Everything below relies on IEEE 754 binary32/binary64 arithmetic, round
 * to nearest, ties to even (the default mode, which Python never changes), evaluated in
 * the type written (FLT_EVAL_METHOD 0, checked below: not x87) and as written: the loader
 * compiles with -std=c99 -ffp-contract=off and never with -ffast-math (which would let the
 * compiler fold (t - magic) back into x, or drop the tie test) nor -march=native (one
 * shared library per machine type, not per CPU).
 *
 * Notation: m mantissa bits (2..16), top = 2**(m-1) - 1 (odd, <= 32767), e the block
 * exponent (-127..127), k = m - 2 - e (so k is in [-127, 141]), and the exact scaled value
 * s = x * 2**k. The mantissa is q = round(s) clamped to +-top; a value saturates (is
 * counted) iff |s| >= top + 1/2: the tie top + 1/2 rounds to top + 1 in both modes (top is
 * odd), every smaller magnitude to at most top. Rounding commutes with clamping to the
 * integers +-top, so clamping s first gives the same q.
 *
 * The saturation count: |x| (its bit pattern, sign cleared; patterns of non-negative
 * floats order as their values) is compared with the smallest float32 >= (top + 1/2) *
 * 2**-k, i.e. exactly |s| >= top + 1/2, only in blocks whose maximum reaches it (rare with
 * dynamic exponents: only when rounding carries the maximum past top).
 *
 * Two exact ways to compute q, chosen per block by k:
 *
 * 1. Fast path (float32, 4 lanes per SSE2 vector), k >= -104: the magic number
 *    M = 1.5 * 2**(23 - k) is then a finite float32 (and normal: k <= 141). x is first
 *    clamped to +-top * 2**-k (a float32: at most 15 significant bits, 2**-141 <= 2**-k
 *    <= 2**104), so |s| <= top < 2**15 and x + M lies in [2**(23-k), 2**(24-k)), where
 *    float32 values are spaced 2**-k apart: the sum, rounded to nearest even, is
 *    M + rint(s) * 2**-k exactly (M / 2**-k = 1.5 * 2**23 is even, so the parity of the
 *    multiple is that of rint(s)), and its bit pattern is that of M plus rint(s); the low
 *    16 bits of M's pattern are zero, so they hold rint(s) in two's complement. Ties away
 *    from zero: r = t - M is exact (Sterbenz), and so is d = x - r (|d| <= 2**-(k+1), a
 *    multiple of the spacing of x, or x itself when r = 0); a tie rounded towards zero is
 *    d = 2**-(k+1) (a float32 for k <= 148) with the sign of x, and adding 2d, one unit,
 *    to t is exact and stays in the binade.
 *
 * 2. Exact path (float64, 2 lanes), k < -104 (exponents e > m + 102: large static
 *    exponents, or values of 2**(m+103) and more): x = f * 2**p with an integer |f| < 2**24
 *    and p in [-149, 104], so s = f * 2**(p + k) with p + k in [-276, 245]: 0 or of
 *    magnitude in [2**-276, 2**269), inside the normal double range, with f fitting the
 *    53-bit significand; (double)x * 2**k is therefore exact for every float32 x and every
 *    exponent (the path would be exact for every block; it is only slower). s is clamped
 *    to c in [-top, top]; c + 1.5 * 2**52 is rounded by the FPU to an integer (doubles in
 *    [2**52, 2**53) are spaced 1 apart), ties to even, exactly since |c| < 2**51, and
 *    subtracting the magic number back is exact; ties away are fixed as in 1 (d = c - r
 *    exact, a tie towards zero is d = +-1/2 with the sign of c).
 *
 * No libm calls (rint and round are library calls without SSE4.1). Integer conversions
 * are all of in-range values (sign_extend below for the low 16 bits of a pattern).
 */

#include <float.h>
#include <stdint.h>
#include <string.h>

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "the BFP kernel needs float and double arithmetic evaluated in their own types"
#endif

/* Return codes (host/numerics/_ckernel.py names them). */
#define BFP_OK 0
#define BFP_NONFINITE 1         /* x has an inf or NaN: the outputs are incomplete */
#define BFP_EARG (-1)           /* a size or width out of range */
#define BFP_EEXP (-2)           /* a static exponent outside [-127, 127] */

#define E8M0_BIAS 127
#define MAGIC_K_MIN (-104)      /* smallest k whose 1.5 * 2**(23 - k) is a finite float32 */

/* Keeps gcc from unrolling a block loop completely before vectorizing it (which it does
 * to short constant-count loops nested in the row loop, leaving scalar code). */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_UNROLL _Pragma("GCC unroll 1")
#else
#define NO_UNROLL
#endif

#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif
#define PREFETCH_AHEAD 512      /* values: how far ahead the loops ask for the input */

/* Version of the interface below; the loader checks it. */
int bfp_kernel_version(void) { return 1; }

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The m-bit two's complement field u (0 <= u < 2**m) as a signed integer. */
static inline int16_t sign_extend(uint32_t u, int m)
{
    const uint32_t sign = 1u << (m - 1);
    return (int16_t)((int32_t)(u ^ sign) - (int32_t)sign);
}

/* 2**k as a double, for k in [-1022, 1023] (here within [-142, 141]). */
static inline double pow2(int k)
{
    uint64_t u = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Per block exponent e (index e + 127): everything a block needs, computed once a call. */
struct exponent_consts {
    double scale;               /* 2**k */
    float magic;                /* 1.5 * 2**(23 - k) (fast path only) */
    float half;                 /* 2**-(k + 1) (fast path only) */
    float clamp;                /* top * 2**-k (fast path only) */
    int32_t threshold;          /* bit pattern of the smallest float32 >= (top + 1/2) * 2**-k */
    int32_t fast;               /* k >= MAGIC_K_MIN */
};

static void exponent_table(int m, struct exponent_consts *table)
{
    const double limit = (double)((1 << (m - 1)) - 1) + 0.5;
    for (int e = -E8M0_BIAS; e <= E8M0_BIAS; e++) {
        struct exponent_consts *c = &table[e + E8M0_BIAS];
        const int k = m - 2 - e;
        c->scale = pow2(k);
        c->fast = k >= MAGIC_K_MIN;
        c->magic = c->fast ? (float)(1.5 * pow2(23 - k)) : 0.0f;       /* exact */
        c->half = c->fast ? (float)pow2(-(k + 1)) : 0.0f;               /* exact */
        c->clamp = c->fast ? (float)((limit - 0.5) * pow2(-k)) : 0.0f;  /* exact */
        /* t = limit * 2**-k is an exact double (limit has at most 17 significant bits),
         * and a float32 too unless it is 2**128 or more (its lowest bit, 2**-(k+1), is at
         * least 2**-142); rounding up to the next float32 keeps the rule exact anyway. */
        const double t = limit * pow2(-k);
        if (t >= 340282366920938463463374607431768211456.0) {           /* 2**128 */
            c->threshold = 0x7F800000;          /* no finite float32 saturates */
        } else {
            const float f = (float)t;
            uint32_t bits = f32_bits(f);
            if ((double)f < t)
                bits += 1;                      /* the next float32 up (t > 0) */
            c->threshold = (int32_t)bits;
        }
    }
}

/* The largest |x| bit pattern (sign cleared) of w values: its exponent field is the
 * block's E8M0 code, and patterns >= 0x7F800000 are inf or NaN. The patterns are below
 * 2**31, so they compare as int32 (cheaper than uint32 without SSE4.1); patterns of |x|
 * order as the magnitudes. */
static inline int32_t block_amax(const float *restrict src, int64_t w)
{
    int32_t amax = 0;
    NO_UNROLL
    for (int64_t j = 0; j < w; j++) {
        int32_t a = (int32_t)(f32_bits(src[j]) & 0x7FFFFFFFu);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* Path 1 (see the top comment): k >= MAGIC_K_MIN; x clamped to +-clamp = +-top * 2**-k
 * (a float32: at most 15 significant bits, 2**-141 <= 2**-k <= 2**104). */
static inline void block_round_fast(const float *restrict src, int16_t *restrict dst,
                                    int64_t w, float magic, float half, float clamp,
                                    int away)
{
    if (away) {
        NO_UNROLL
        for (int64_t j = 0; j < w; j++) {
            float x = src[j];
            x = x > clamp ? clamp : x;
            x = x < -clamp ? -clamp : x;
            float t = x + magic;                /* M + rint(s) * 2**-k, ties to even */
            const float r = t - magic;          /* exact */
            const float d = x - r;              /* exact */
            const float h = x < 0.0f ? -half : half;
            const float tie = d == h ? 1.0f : 0.0f;
            t = t + tie * (d + d);              /* a tie towards zero: one unit away */
            dst[j] = sign_extend(f32_bits(t) & 0xFFFFu, 16);    /* the low 16 bits */
        }
    } else {
        NO_UNROLL
        for (int64_t j = 0; j < w; j++) {
            float x = src[j];
            x = x > clamp ? clamp : x;
            x = x < -clamp ? -clamp : x;
            const float t = x + magic;          /* M + rint(s) * 2**-k, ties to even */
            dst[j] = sign_extend(f32_bits(t) & 0xFFFFu, 16);    /* the low 16 bits */
        }
    }
}

/* Path 2 (see the top comment): k < MAGIC_K_MIN, in double (exact for any block). */
static void block_round_exact(const float *restrict src, int16_t *restrict dst, int64_t w,
                              double scale, double top, int away)
{
    const double magic = 6755399441055744.0;        /* 1.5 * 2**52 */
    for (int64_t j = 0; j < w; j++) {
        const double s = (double)src[j] * scale;    /* exact */
        double c = s > top ? top : s;
        c = c < -top ? -top : c;
        double r = c + magic;                       /* rounded to an integer, ties to even */
        r = r - magic;                              /* exact */
        if (away) {
            const double d = c - r;                 /* exact */
            const double h = c < 0.0 ? -0.5 : 0.5;
            if (d == h)
                r = r + (d + d);
        }
        dst[j] = (int16_t)(int32_t)r;
    }
}

/* How many of w values have an |x| pattern >= threshold. */
static int64_t block_count_from(const float *restrict src, int64_t w, int32_t threshold)
{
    int64_t count = 0;
    for (int64_t j = 0; j < w; j++)
        count += (int32_t)(f32_bits(src[j]) & 0x7FFFFFFFu) >= threshold;
    return count;
}

/* One block: w values present of n (w < n only for the last block of a row, the rest
 * zero padding). exp_in is NULL (dynamic exponent) or the block's static exponent. */
static inline int block_quantize(const float *restrict src, int16_t *restrict dst,
                                 int64_t w, int64_t n, int m, int away,
                                 const struct exponent_consts *restrict table,
                                 const int32_t *restrict exp_in, int16_t *restrict exp_out,
                                 int64_t *restrict sat_out)
{
    const int32_t amax = block_amax(src, w);
    if (amax >= 0x7F800000)
        return BFP_NONFINITE;
    int e;
    if (exp_in) {
        e = *exp_in;
        if (e < -E8M0_BIAS || e > E8M0_BIAS)
            return BFP_EEXP;
    } else {
        e = (amax >> 23) - E8M0_BIAS;       /* zero/subnormal maxima: field 0, e = -127 */
    }
    *exp_out = (int16_t)e;
    const struct exponent_consts *c = &table[e + E8M0_BIAS];
    if (c->fast)
        block_round_fast(src, dst, w, c->magic, c->half, c->clamp, away);
    else
        block_round_exact(src, dst, w, c->scale, (double)((1 << (m - 1)) - 1), away);
    /* sat_out comes zeroed: only the blocks that saturate are written. */
    if (amax >= c->threshold)
        *sat_out = block_count_from(src, w, c->threshold);
    for (int64_t j = w; j < n; j++)
        dst[j] = 0;
    return BFP_OK;
}

/* One row of blocks. Inlined with n a compile-time constant for the common block sizes,
 * so that the block loops are vectorized without run-time trip counts. */
static inline int row_quantize(const float *restrict row, int64_t left,
                               int16_t *restrict qrow, int64_t length, int64_t n, int m,
                               int away,
                               const struct exponent_consts *restrict table,
                               const int32_t *restrict exps, int16_t *restrict exps_out,
                               int64_t *restrict sat_out)
{
    const int64_t full = length / n;
    for (int64_t b = 0; b < full; b++) {
        if (b * n + PREFETCH_AHEAD < left)     /* also the next rows */
            PREFETCH(row + b * n + PREFETCH_AHEAD);
        const int rc = block_quantize(row + b * n, qrow + b * n, n, n, m, away, table,
                                      exps ? exps + b : NULL, exps_out + b, sat_out + b);
        if (rc != BFP_OK)
            return rc;
    }
    if (full * n < length)
        return block_quantize(row + full * n, qrow + full * n, length - full * n, n, m,
                              away, table, exps ? exps + full : NULL, exps_out + full,
                              sat_out + full);
    return BFP_OK;
}

#define ROW_QUANTIZE_N(N) \
    static int row_quantize_##N(const float *restrict row, int64_t left, \
                                int16_t *restrict qrow, int64_t length, int m, int away, \
                                const struct exponent_consts *restrict table, \
                                const int32_t *restrict exps, int16_t *restrict exps_out, \
                                int64_t *restrict sat_out) \
    { \
        return row_quantize(row, left, qrow, length, N, m, away, table, exps, exps_out, \
                            sat_out); \
    }
ROW_QUANTIZE_N(8)
ROW_QUANTIZE_N(16)
ROW_QUANTIZE_N(32)

/*
 * Quantize x, rows x length float32 values in C order, in blocks of n along each row
 * (the last block of a row zero padded).
 *   exps: NULL for dynamic exponents, else one static exponent per block (rows x nblocks,
 *         each in [-127, 127]).
 *   exps_out: rows x nblocks int16 exponents; q_out: rows x (nblocks * n) int16 mantissas;
 *   sat_out: rows x nblocks int64 saturation counts, zeroed by the caller (only non-zero
 *         counts are written).
 * Returns BFP_OK, BFP_NONFINITE (x has an inf or NaN; the outputs are incomplete) or a
 * negative error code (BFP_EARG, BFP_EEXP).
 */
int bfp_quantize_f32(const float *restrict x, int64_t rows, int64_t length, int64_t n,
                     int32_t m, int32_t away, const int32_t *restrict exps,
                     int16_t *restrict exps_out, int16_t *restrict q_out,
                     int64_t *restrict sat_out)
{
    if (rows < 0 || length < 0 || n < 1 || m < 2 || m > 16)
        return BFP_EARG;
    struct exponent_consts table[2 * E8M0_BIAS + 1];
    exponent_table(m, table);
    const int a = away != 0;
    const int64_t nblocks = (length + n - 1) / n;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * length;
        const int64_t left = (rows - r) * length;   /* values from row to the end of x */
        int16_t *qrow = q_out + r * nblocks * n;
        const int32_t *erow = exps ? exps + r * nblocks : NULL;
        int16_t *eo = exps_out + r * nblocks;
        int64_t *so = sat_out + r * nblocks;
        int rc;
        if (n == 8)
            rc = row_quantize_8(row, left, qrow, length, m, a, table, erow, eo, so);
        else if (n == 16)
            rc = row_quantize_16(row, left, qrow, length, m, a, table, erow, eo, so);
        else if (n == 32)
            rc = row_quantize_32(row, left, qrow, length, m, a, table, erow, eo, so);
        else
            rc = row_quantize(row, left, qrow, length, n, m, a, table, erow, eo, so);
        if (rc != BFP_OK)
            return rc;
    }
    return BFP_OK;
}

/* ---- pack ------------------------------------------------------------------------- */

/* The fields of q[0..w) as m-bit two's complement, least significant bit first, from a
 * byte boundary at p, zero padded to a whole byte. Bytes are stored one by one (no
 * dependence on the machine's byte order). */
static void pack_bits(const int16_t *restrict q, int64_t w, int m, uint8_t *restrict p)
{
    const uint64_t mask = (1u << m) - 1u;
    uint64_t acc = 0;           /* at most 31 + 16 pending bits */
    int pending = 0;
    for (int64_t j = 0; j < w; j++) {
        acc |= ((uint64_t)(uint16_t)q[j] & mask) << pending;
        pending += m;
        if (pending >= 32) {
            p[0] = (uint8_t)acc;
            p[1] = (uint8_t)(acc >> 8);
            p[2] = (uint8_t)(acc >> 16);
            p[3] = (uint8_t)(acc >> 24);
            p += 4;
            acc >>= 32;
            pending -= 32;
        }
    }
    for (; pending > 0; pending -= 8) {
        *p++ = (uint8_t)acc;
        acc >>= 8;
    }
}

/* The body of one block (after its exponent byte). Widths that fill whole bytes go
 * byte-wise, and the fields left over (fewer than a byte's worth, starting on a byte
 * boundary) bit by bit. */
static inline void pack_block(const int16_t *restrict q, int64_t n, int m,
                              uint8_t *restrict p)
{
    int64_t j = 0;
    if (m == 8) {
        NO_UNROLL
        for (j = 0; j < n; j++)
            p[j] = (uint8_t)q[j];
        return;
    }
    if (m == 16) {
        NO_UNROLL
        for (j = 0; j < n; j++) {
            const uint16_t u = (uint16_t)q[j];
            p[2 * j] = (uint8_t)u;
            p[2 * j + 1] = (uint8_t)(u >> 8);
        }
        return;
    }
    /* (Products rather than shifts: gcc narrows these to byte lanes, where SSE2 has no
     * shifts, and then would not vectorize.) */
    if (m == 4) {
        const int64_t whole = n / 2;
        NO_UNROLL
        for (int64_t i = 0; i < whole; i++)
            p[i] = (uint8_t)(((uint32_t)(uint16_t)q[2 * i] & 0xFu)
                             + ((uint32_t)(uint16_t)q[2 * i + 1] & 0xFu) * 16u);
        j = 2 * whole;
        p += whole;
    } else if (m == 2) {
        const int64_t whole = n / 4;
        NO_UNROLL
        for (int64_t i = 0; i < whole; i++)
            p[i] = (uint8_t)(((uint32_t)(uint16_t)q[4 * i] & 3u)
                             + ((uint32_t)(uint16_t)q[4 * i + 1] & 3u) * 4u
                             + ((uint32_t)(uint16_t)q[4 * i + 2] & 3u) * 16u
                             + ((uint32_t)(uint16_t)q[4 * i + 3] & 3u) * 64u);
        j = 4 * whole;
        p += whole;
    }
    if (j < n)
        pack_bits(q + j, n - j, m, p);
}

/*
 * Pack count blocks: exps (int16 exponents; the E8M0 code is the low 8 bits of e + 127)
 * and q (count x n int16 mantissas; the low m bits of each are its field) into out,
 * count x block_bytes(n, m) bytes.
 */
int bfp_pack(const int16_t *restrict exps, const int16_t *restrict q, int64_t count,
             int64_t n, int32_t m, uint8_t *restrict out)
{
    if (count < 0 || n < 1 || m < 2 || m > 16)
        return BFP_EARG;
    const int64_t nbytes = (8 + n * m + 7) / 8;
    const int64_t total = count * n;
    for (int64_t b = 0; b < count; b++) {
        if (b * n + 2 * PREFETCH_AHEAD < total)
            PREFETCH(q + b * n + 2 * PREFETCH_AHEAD);
        uint8_t *p = out + b * nbytes;
        p[0] = (uint8_t)(exps[b] + E8M0_BIAS);
        if (n == 16)
            pack_block(q + b * 16, 16, m, p + 1);
        else if (n == 32)
            pack_block(q + b * 32, 32, m, p + 1);
        else
            pack_block(q + b * n, n, m, p + 1);
    }
    return BFP_OK;
}

/* ---- unpack ----------------------------------------------------------------------- */

/* Inverse of pack_bits: w fields from a byte boundary at p. */
static void unpack_bits(const uint8_t *restrict p, int64_t w, int m, int16_t *restrict q)
{
    const uint32_t mask = (1u << m) - 1u;
    uint32_t acc = 0;           /* at most 7 + 16 bits */
    int avail = 0;
    for (int64_t j = 0; j < w; j++) {
        while (avail < m) {
            acc |= (uint32_t)*p++ << avail;
            avail += 8;
        }
        q[j] = sign_extend(acc & mask, m);
        acc >>= m;
        avail -= m;
    }
}

static inline void unpack_block(const uint8_t *restrict p, int64_t n, int m,
                                int16_t *restrict q)
{
    int64_t j = 0;
    if (m == 8) {
        NO_UNROLL
        for (j = 0; j < n; j++)
            q[j] = sign_extend(p[j], 8);
        return;
    }
    if (m == 16) {
        NO_UNROLL
        for (j = 0; j < n; j++)
            q[j] = sign_extend((uint32_t)p[2 * j] | ((uint32_t)p[2 * j + 1] << 8), 16);
        return;
    }
    if (m == 4) {
        const int64_t whole = n / 2;
        NO_UNROLL
        for (int64_t i = 0; i < whole; i++) {
            q[2 * i] = sign_extend(p[i] & 0xFu, 4);
            q[2 * i + 1] = sign_extend((uint32_t)p[i] >> 4, 4);
        }
        j = 2 * whole;
        p += whole;
    } else if (m == 2) {
        const int64_t whole = n / 4;
        NO_UNROLL
        for (int64_t i = 0; i < whole; i++) {
            q[4 * i] = sign_extend(p[i] & 3u, 2);
            q[4 * i + 1] = sign_extend(((uint32_t)p[i] >> 2) & 3u, 2);
            q[4 * i + 2] = sign_extend(((uint32_t)p[i] >> 4) & 3u, 2);
            q[4 * i + 3] = sign_extend((uint32_t)p[i] >> 6, 2);
        }
        j = 4 * whole;
        p += whole;
    }
    if (j < n)
        unpack_bits(p, n - j, m, q + j);
}

/*
 * Unpack count blocks of block_bytes(n, m) bytes from data: exps_out (count int16
 * exponents, code - 127) and q_out (count x n int16 mantissas). first_bad[3] receives the
 * index of the first block with the reserved code 0xFF, with a mantissa -2**(m-1), and
 * with non-zero padding bits, each -1 if there is none (the caller raises the errors).
 */
int bfp_unpack(const uint8_t *restrict data, int64_t count, int64_t n, int32_t m,
               int16_t *restrict exps_out, int16_t *restrict q_out,
               int64_t *restrict first_bad)
{
    if (count < 0 || n < 1 || m < 2 || m > 16)
        return BFP_EARG;
    const int64_t nbytes = (8 + n * m + 7) / 8;
    const int spare = (int)(nbytes * 8 - (8 + n * m));     /* 0..7 padding bits */
    const int16_t lowest = (int16_t)-(1 << (m - 1));
    const int64_t total = count * nbytes;
    first_bad[0] = first_bad[1] = first_bad[2] = -1;
    for (int64_t b = 0; b < count; b++) {
        if (b * nbytes + 2 * PREFETCH_AHEAD < total)
            PREFETCH(data + b * nbytes + 2 * PREFETCH_AHEAD);
        const uint8_t *p = data + b * nbytes;
        int16_t *q = q_out + b * n;
        exps_out[b] = (int16_t)(p[0] - E8M0_BIAS);
        if (n == 16)
            unpack_block(p + 1, 16, m, q);
        else if (n == 32)
            unpack_block(p + 1, 32, m, q);
        else
            unpack_block(p + 1, n, m, q);
        int low = 0;
        for (int64_t j = 0; j < n; j++)
            low |= q[j] == lowest;
        if (p[0] == 0xFF && first_bad[0] < 0)
            first_bad[0] = b;
        if (low && first_bad[1] < 0)
            first_bad[1] = b;
        if (spare && (p[nbytes - 1] >> (8 - spare)) && first_bad[2] < 0)
            first_bad[2] = b;
    }
    return BFP_OK;
}
