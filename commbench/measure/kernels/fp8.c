#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* fp32 -> fp8 code, round to nearest even, as straight-line integer/float ops so the loops vectorise (selects
   written as ?: on values, which gcc turns into masked blends; no table, no branch).
   Rounding: let E be the exponent field of a = |y|, raised to the format's smallest normal exponent EMIN (below
   it the fp8 step is the subnormal step). M = 2^(E - 127 + 23 - MBITS) has a float32 ulp equal to the fp8 step at
   a's magnitude, so the single float add a + M rounds a to that step, ties to even, and leaves the number of
   steps in the low bits of the sum: code = bits(a + M) - bits(M) + ((E - EMIN) << MBITS). A carry into the next
   binade comes out right because the code's exponent and mantissa fields are contiguous, as in fp32.
   FAST: valid only for |y| <= the format's max (no saturation, no inf/NaN); the loop returns max |y| as bits so
   the caller can check that and redo a chunk with the full encoder. FULL: E is also capped (EMIN + 32) so M
   cannot overflow, finite values saturate to the largest finite code, inf -> inf (e5m2) or NaN (e4m3fn),
   NaN -> NaN, the sign kept throughout. */
#define FP8_ENCODERS(FMT, MBITS, EMIN, MAXCODE, INFCODE)                                                      \
static uint32_t enc_fast_##FMT(const float* __restrict x, uint8_t* __restrict q, int64_t n, float inv) {      \
    uint32_t mx = 0;                                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                                         \
        uint32_t b = f2u(x[i] * inv), a = b & 0x7FFFFFFFu;                                                   \
        mx = a > mx ? a : mx;                                                                                 \
        uint32_t e = a & 0x7F800000u;                                                                         \
        e = e < ((uint32_t)(EMIN) << 23) ? ((uint32_t)(EMIN) << 23) : e;                                      \
        uint32_t m = e + ((uint32_t)(23 - MBITS) << 23);                                                      \
        uint32_t r = f2u(u2f(a) + u2f(m)) - m + (e >> (23 - MBITS)) - ((uint32_t)(EMIN) << MBITS);           \
        q[i] = (uint8_t)(r | ((b >> 24) & 0x80u));                                                            \
    }                                                                                                         \
    return mx;                                                                                                \
}                                                                                                             \
static void enc_full_##FMT(const float* __restrict x, uint8_t* __restrict q, int64_t n, float inv) {          \
    for (int64_t i = 0; i < n; i++) {                                                                         \
        uint32_t b = f2u(x[i] * inv), a = b & 0x7FFFFFFFu;                                                   \
        uint32_t e = a & 0x7F800000u;                                                                         \
        e = e < ((uint32_t)(EMIN) << 23) ? ((uint32_t)(EMIN) << 23) : e;                                      \
        e = e > ((uint32_t)(EMIN + 32) << 23) ? ((uint32_t)(EMIN + 32) << 23) : e;                            \
        uint32_t m = e + ((uint32_t)(23 - MBITS) << 23);                                                      \
        uint32_t r = f2u(u2f(a) + u2f(m)) - m + (e >> (23 - MBITS)) - ((uint32_t)(EMIN) << MBITS);           \
        r = r > (MAXCODE) ? (MAXCODE) : r;                                                                    \
        r = a > 0x7F800000u ? 0x7Fu : r;                                                                      \
        r = a == 0x7F800000u ? (INFCODE) : r;                                                                 \
        q[i] = (uint8_t)(r | ((b >> 24) & 0x80u));                                                            \
    }                                                                                                         \
}
FP8_ENCODERS(e4m3, 3, 121, 0x7Eu, 0x7Fu)
FP8_ENCODERS(e5m2, 2, 113, 0x7Bu, 0x7Cu)

/* Bits of each format's max and half its max (positive floats order like their bit patterns). */
static const uint32_t MAXBITS[2] = {0x43E00000u, 0x47600000u};   /* 448, 57344 */
static const uint32_t HALFBITS[2] = {0x43600000u, 0x46E00000u};  /* 224, 28672 */

static inline uint32_t enc_fast(const float* x, uint8_t* q, int64_t n, float inv, int fmt) {
    return fmt == 0 ? enc_fast_e4m3(x, q, n, inv) : enc_fast_e5m2(x, q, n, inv);
}
static inline void enc_full(const float* x, uint8_t* q, int64_t n, float inv, int fmt) {
    if (fmt == 0) enc_full_e4m3(x, q, n, inv); else enc_full_e5m2(x, q, n, inv);
}
/* Any chunk: the fast encoder, redone with the full one when some |y| is beyond max (or not finite). */
static inline void enc_checked(const float* x, uint8_t* q, int64_t n, float inv, int fmt) {
    if (enc_fast(x, q, n, inv, fmt) > MAXBITS[fmt]) enc_full(x, q, n, inv, fmt);
}

/* max |x| over finite values; *nonfinite set when any element is inf or NaN. The magnitudes' bit patterns
   order like the values (and inf/NaN sort above every finite one), so an integer max vectorises. */
static float amax_range(const float* x, int64_t n, int* nonfinite) {
    const uint32_t* u = (const uint32_t*)x;
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = u[i] & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    if (m < 0x7F800000u) return u2f(m);
    *nonfinite = 1;
    m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = u[i] & 0x7FFFFFFFu;
        a = a < 0x7F800000u ? a : 0u;
        m = a > m ? a : m;
    }
    return u2f(m);
}

/* Power-of-two scale exponent: smallest k with amax / 2^k <= fmax, clamped to [-126, 127]; 0 for amax 0.
   fmax = 1.75 * 2^emax for both formats, so with amax = m * 2^e (1 <= m < 2): k = e - emax, plus 1 when
   m > 1.75 (mantissa bits above 0x600000). Subnormal amax is below 2^-126 * fmax: clamped to -126. */
static inline int scale_exp(float amax, int emax) {
    uint32_t b = f2u(amax);
    if (b == 0) return 0;
    int e = (int)(b >> 23) - 127;
    if (e == -127) return -126;
    int k = e - emax + ((b & 0x7FFFFFu) > 0x600000u ? 1 : 0);
    return k < -126 ? -126 : (k > 127 ? 127 : k);
}

static inline float pow2(int k) { return u2f((uint32_t)(k + 127) << 23); }  /* -126 <= k <= 127 */

#define CHUNK 16384  /* elements (64 KiB of input): stays in L2 for a re-encode */

/* Tensor scaling over x[lo, hi), one pass in the common case: each chunk is encoded with the scale of the
   running amax, the encoder's max |y| says whether the chunk fits (|y| <= max); only when it does not is the
   chunk's amax taken and the chunk re-encoded (from cache) with the raised scale. Chunks encoded before the
   scale last changed are stale: [lo, *stale_end) is re-encoded once the final scale is known. While the
   running amax is 0 the scale is not monotone yet (amax 0 -> scale 1), so those chunks take the amax first. */
static float tensor_pass(const float* x, uint8_t* q, int64_t lo, int64_t hi, int fmt, int emax, int* nonfinite,
                         int64_t* stale_end) {
    float m = 0.0f;
    int k = 0;
    *stale_end = lo;
    for (int64_t c = lo; c < hi; c += CHUNK) {
        int64_t len = hi - c < CHUNK ? hi - c : CHUNK;
        if (m > 0.0f && enc_fast(x + c, q + c, len, pow2(-k), fmt) <= MAXBITS[fmt]) continue;
        int nf = 0;
        float a = amax_range(x + c, len, &nf);
        *nonfinite |= nf;
        if (a > m) {
            m = a;
            int nk = scale_exp(m, emax);
            if (nk != k) { k = nk; *stale_end = c; }
        }
        if (nf) enc_full(x + c, q + c, len, pow2(-k), fmt);
        else enc_fast(x + c, q + c, len, pow2(-k), fmt);
    }
    return m;
}

/* Block scaling over blocks [b0, b1): each block is first encoded with the previous block's scale; the
   encoder's max |y| tells whether that is also this block's scale (max/2 < max|y| <= max, or the smallest
   scale). Otherwise the block is re-encoded (it is in L1 by then) with its own scale, computed from that max
   |y| when it says the block is finite and is a normal float (then it is exactly amax * 2^-k), else from the
   block's amax. */
static int block_pass(const float* x, uint8_t* q, float* scales, int64_t n, int64_t block, int64_t b0, int64_t b1,
                      int fmt, int emax) {
    int nonfinite = 0, k = 0, have = 0;
    for (int64_t b = b0; b < b1; b++) {
        int64_t s = b * block;
        int64_t len = n - s < block ? n - s : block;
        if (have) {
            uint32_t mx = enc_fast(x + s, q + s, len, pow2(-k), fmt);
            if (mx <= MAXBITS[fmt] && (mx > HALFBITS[fmt] || (k == -126 && mx != 0))) {
                scales[b] = pow2(k);
                continue;
            }
            if (mx >= 0x00800000u && mx < 0x7F800000u) {
                /* All finite and the largest |y| a normal float, so exactly the block's amax times 2^-k. */
                k = scale_exp(u2f(mx) * pow2(k), emax);
                scales[b] = pow2(k);
                enc_fast(x + s, q + s, len, pow2(-k), fmt);
                continue;
            }
        }
        int nf = 0;
        k = scale_exp(amax_range(x + s, len, &nf), emax);
        have = 1;
        nonfinite |= nf;
        scales[b] = pow2(k);
        if (nf) enc_full(x + s, q + s, len, pow2(-k), fmt);
        else enc_fast(x + s, q + s, len, pow2(-k), fmt);
    }
    return nonfinite;
}

#define MAX_THREADS 256

/* mode 0 tensor, 1 block, 2 none. Returns 1 when any input was non-finite. */
int cb_fp8_quantize(const float* x, uint8_t* q, float* scales, int64_t n, int64_t block, int fmt, int mode,
                    int nthreads) {
    int emax = fmt == 0 ? 8 : 15;
    int nonfinite = 0;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if (mode == 2) {
        scales[0] = 1.0f;
        #pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t c = 0; c < n; c += CHUNK) {
            int64_t len = n - c < CHUNK ? n - c : CHUNK;
            enc_checked(x + c, q + c, len, 1.0f, fmt);
        }
        return 0;
    }
    if (mode == 1) {
        int64_t nb = (n + block - 1) / block;
        int64_t nt = nthreads < nb ? nthreads : nb;
        #pragma omp parallel for num_threads(nthreads) schedule(static) reduction(|:nonfinite)
        for (int64_t t = 0; t < nt; t++)
            nonfinite |= block_pass(x, q, scales, n, block, nb * t / nt, nb * (t + 1) / nt, fmt, emax);
        return nonfinite;
    }
    /* Tensor: each thread runs the one-pass scheme on its own range (whole chunks), then the final scale
       (from the overall amax) is known and every thread re-encodes what it encoded with another one. */
    int64_t nch = (n + CHUNK - 1) / CHUNK;
    int64_t nt = nthreads < nch ? nthreads : nch;
    float tm[MAX_THREADS];
    int64_t stale[MAX_THREADS];
    int tnf[MAX_THREADS];
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < nt; t++) {
        int64_t lo = nch * t / nt * CHUNK, hi = nch * (t + 1) / nt * CHUNK;
        hi = hi < n ? hi : n;
        tnf[t] = 0;
        tm[t] = tensor_pass(x, q, lo, hi, fmt, emax, &tnf[t], &stale[t]);
    }
    float m = 0.0f;
    for (int64_t t = 0; t < nt; t++) {
        m = tm[t] > m ? tm[t] : m;
        nonfinite |= tnf[t];
    }
    int k = scale_exp(m, emax);
    scales[0] = pow2(k);
    float inv = pow2(-k);
    int redo = 0;
    for (int64_t t = 0; t < nt; t++) {
        int64_t lo = nch * t / nt * CHUNK;
        if (scale_exp(tm[t], emax) != k) stale[t] = n;  /* this thread's range is all stale */
        redo |= stale[t] > lo;
    }
    if (!redo) return nonfinite;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < nt; t++) {
        int64_t lo = nch * t / nt * CHUNK, hi = nch * (t + 1) / nt * CHUNK;
        hi = hi < n ? hi : n;
        int64_t end = stale[t] < hi ? stale[t] : hi;
        for (int64_t c = lo; c < end; c += CHUNK) {
            int64_t len = end - c < CHUNK ? end - c : CHUNK;
            if (tnf[t]) enc_full(x + c, q + c, len, inv, fmt);
            else enc_fast(x + c, q + c, len, inv, fmt);
        }
    }
    return nonfinite;
}

/* fp8 code -> float32 by bit arithmetic (vectorises; a table gather does not): normals re-bias the exponent,
   subnormals are mantissa * step, specials map to inf/NaN. One routine for both formats, parameterised by the
   format's mantissa bits and exponent bias; callers pass constants, so each inlined copy folds to the
   straight-line code of its format. IEEE-like formats (e5m2) spend the all-ones exponent on inf (mantissa 0)
   and NaN, keeping the mantissa bits; a finite-only one (e4m3fn) has a single NaN code, 0x7F, and no inf. */
static inline float dec_fp8(uint32_t c, const uint32_t MBITS, const uint32_t BIAS, const int FINITE_ONLY) {
    const uint32_t mmask = (1u << MBITS) - 1u;
    uint32_t sign = (c & 0x80u) << 24, mag = c & 0x7Fu;
    uint32_t nb = (mag << (23 - MBITS)) + ((127 - BIAS) << 23);
    uint32_t sb = f2u((float)(int)(mag & mmask) * pow2(1 - (int)BIAS - (int)MBITS));
    uint32_t sub = 0u - (uint32_t)(mag <= mmask);
    uint32_t r = (sb & sub) | (nb & ~sub);
    uint32_t spec = 0u - (uint32_t)(FINITE_ONLY ? mag == 0x7Fu : mag >= (0x7Fu & ~mmask));
    uint32_t special = FINITE_ONLY ? 0x7FC00000u : 0x7F800000u | ((mag & mmask) << (23 - MBITS));
    r = (r & ~spec) | (special & spec);
    return u2f(r | sign);
}

static inline void decode_fmt(const uint8_t* __restrict q, float* __restrict o, int64_t n, float sc, int acc,
                              const uint32_t MBITS, const uint32_t BIAS, const int FINITE_ONLY) {
    if (acc) for (int64_t i = 0; i < n; i++) o[i] += dec_fp8(q[i], MBITS, BIAS, FINITE_ONLY) * sc;
    else for (int64_t i = 0; i < n; i++) o[i] = dec_fp8(q[i], MBITS, BIAS, FINITE_ONLY) * sc;
}

static void decode_range(const uint8_t* __restrict q, float* __restrict o, int64_t n, float sc, int fmt, int acc) {
    if (fmt == 0) decode_fmt(q, o, n, sc, acc, 3, 7, 1);   /* e4m3fn */
    else decode_fmt(q, o, n, sc, acc, 2, 15, 0);           /* e5m2 */
}

/* out[i] (+)= fp8(q[i]) * scale of i's block (block = n for one scale). */
void cb_fp8_dequantize(const uint8_t* q, const float* scales, float* out, int64_t n, int64_t block, int fmt,
                       int accumulate, int nthreads) {
    int64_t nb = (n + block - 1) / block;
    if (nb == 1) {
        float sc = scales[0];
        #pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t c = 0; c < n; c += 65536) {
            int64_t len = n - c < 65536 ? n - c : 65536;
            decode_range(q + c, out + c, len, sc, fmt, accumulate);
        }
        return;
    }
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block;
        int64_t len = n - s < block ? n - s : block;
        decode_range(q + s, out + s, len, scales[b], fmt, accumulate);
    }
}
