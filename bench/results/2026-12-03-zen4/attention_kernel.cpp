// Lab prototype (2026-12-03, Zen 4; README.md beside it), not shipped: a CPU flash-attention forward for the
// decoder's tree passes, to measure what a compiled kernel would buy against torch's CPU flash kernel, which runs at
// 55-90 GFLOP/s on this CPU (bfloat16 as float32) where vLLM's cpu_attn runs at 120-146.
//
// q (heads, T, D), k/v (kv_heads, S, D), float32 or bfloat16, any row/head strides with unit stride in D; query
// head h reads key/value head h / (heads / kv_heads). causal_offset < 0: every query sees every key; else query i
// sees keys 0 .. causal_offset + i. Returns the output (heads, T, D) in float32 and the log-sum-exp (heads, T).
// All arithmetic in float32 (bfloat16 inputs are widened exactly); AVX-512F only (built with -march=native).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int BQ = 32;   // query rows of one head per work item (both heads of a group ride along)
constexpr int BK = 64;   // keys per block: 4 vectors of 16

inline __m512 exp512(__m512 x) {
  // exp(x) = 2^n * p(r), r = x - n ln2, |r| <= ln2 / 2; degree-7 Taylor polynomial (error under 1e-8 relative).
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// o[0..3][0..64) += p[0..3][0..BK) @ v[0..BK)[0..64) (rows BK apart in p, D apart in o and v).
inline void weigh_values(const float* p, float* o, const float* v, int64_t D) {
  __m512 a[4][4];
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 4; ++j) a[r][j] = _mm512_loadu_ps(o + r * D + j * 16);
  for (int c = 0; c < BK; ++c) {
    const float* row = v + c * D;
    const __m512 v0 = _mm512_loadu_ps(row), v1 = _mm512_loadu_ps(row + 16), v2 = _mm512_loadu_ps(row + 32),
                 v3 = _mm512_loadu_ps(row + 48);
    for (int r = 0; r < 4; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * BK + c]);
      a[r][0] = _mm512_fmadd_ps(w, v0, a[r][0]);
      a[r][1] = _mm512_fmadd_ps(w, v1, a[r][1]);
      a[r][2] = _mm512_fmadd_ps(w, v2, a[r][2]);
      a[r][3] = _mm512_fmadd_ps(w, v3, a[r][3]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(o + r * D + j * 16, a[r][j]);
}

template <typename T>
inline float widen(T v) { return static_cast<float>(v); }

// Keys of one key/value head as float32: transposed (D, Sp) for the scores, row-major (Sp, D) for the values,
// zero-padded to Sp (a multiple of BK).
template <typename T>
void widen_kv(const T* k, const T* v, int64_t S, int64_t D, int64_t k_row, int64_t v_row, int64_t Sp,
              float* kt, float* vf) {
  for (int64_t s = 0; s < Sp; ++s) {
    for (int64_t d = 0; d < D; ++d) {
      kt[d * Sp + s] = s < S ? widen(k[s * k_row + d]) : 0.f;
      vf[s * D + d] = s < S ? widen(v[s * v_row + d]) : 0.f;
    }
  }
}

template <typename T>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t offset, double scale,
            at::Tensor& out, at::Tensor& lse) {
  const int64_t H = q.size(0), T_ = q.size(1), D = q.size(2), KV = k.size(0), S = k.size(1);
  const int64_t group = H / KV, Sp = (S + BK - 1) / BK * BK;
  TORCH_CHECK(D % 64 == 0, "head_dim must be a multiple of 64 (this prototype)");
  std::vector<float> kt(KV * D * Sp), vf(KV * Sp * D);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  at::parallel_for(0, KV, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      widen_kv(kp + g * k.stride(0), vp + g * v.stride(0), S, D, k.stride(1), v.stride(1), Sp,
               kt.data() + g * D * Sp, vf.data() + g * Sp * D);
  });
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const int64_t blocks = (T_ + BQ - 1) / BQ;
  at::parallel_for(0, KV * blocks, 1, [&](int64_t i0, int64_t i1) {
    const int64_t R = group * BQ;  // rows of one item
    std::vector<float> qf(R * D), sc(R * BK), o(R * D), m(R), l(R);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t g = item / blocks, qb = item % blocks, t0 = qb * BQ, rows = std::min<int64_t>(BQ, T_ - t0);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = g * group + r / BQ, t = t0 + r % BQ;
        for (int64_t d = 0; d < D; ++d)
          qf[r * D + d] = (r % BQ) < rows ? widen(qp[h * q.stride(0) + t * q.stride(1) + d]) * float(scale) : 0.f;
        m[r] = -std::numeric_limits<float>::infinity();
        l[r] = 0.f;
      }
      std::fill(o.begin(), o.end(), 0.f);
      const int64_t key_end = offset < 0 ? S : std::min<int64_t>(S, offset + t0 + rows);
      const float* ktg = kt.data() + g * D * Sp;
      const float* vfg = vf.data() + g * Sp * D;
      for (int64_t kb = 0; kb < key_end; kb += BK) {
        // Scores: 4 rows x 64 keys per step, broadcasting each row's q[d] against the keys' d-th values.
        for (int64_t r0 = 0; r0 < R; r0 += 4) {
          __m512 acc[4][4];
          for (int a = 0; a < 4; ++a)
            for (int c = 0; c < 4; ++c) acc[a][c] = _mm512_setzero_ps();
          for (int64_t d = 0; d < D; ++d) {
            const float* row = ktg + d * Sp + kb;
            const __m512 k0 = _mm512_loadu_ps(row), k1 = _mm512_loadu_ps(row + 16), k2 = _mm512_loadu_ps(row + 32),
                         k3 = _mm512_loadu_ps(row + 48);
            for (int a = 0; a < 4; ++a) {
              const __m512 qv = _mm512_set1_ps(qf[(r0 + a) * D + d]);
              acc[a][0] = _mm512_fmadd_ps(qv, k0, acc[a][0]);
              acc[a][1] = _mm512_fmadd_ps(qv, k1, acc[a][1]);
              acc[a][2] = _mm512_fmadd_ps(qv, k2, acc[a][2]);
              acc[a][3] = _mm512_fmadd_ps(qv, k3, acc[a][3]);
            }
          }
          for (int a = 0; a < 4; ++a)
            for (int c = 0; c < 4; ++c) _mm512_storeu_ps(&sc[(r0 + a) * BK + c * 16], acc[a][c]);
        }
        // Mask keys past the end and (causal) after each row's position; online softmax per row.
        const float ninf = -std::numeric_limits<float>::infinity();
        for (int64_t r = 0; r < R; ++r) {
          float* s = &sc[r * BK];
          const int64_t last = offset < 0 ? S - 1 : std::min<int64_t>(S - 1, offset + t0 + r % BQ);
          if (kb + BK - 1 > last) {  // only blocks that cross the diagonal or the end are masked
            const __m512i lastv = _mm512_set1_epi32(static_cast<int>(last - kb));
            const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            for (int c = 0; c < BK; c += 16) {
              const __mmask16 after = _mm512_cmpgt_epi32_mask(_mm512_add_epi32(iota, _mm512_set1_epi32(c)), lastv);
              _mm512_storeu_ps(s + c, _mm512_mask_blend_ps(after, _mm512_loadu_ps(s + c), _mm512_set1_ps(ninf)));
            }
          }
          __m512 mx = _mm512_max_ps(_mm512_max_ps(_mm512_loadu_ps(s), _mm512_loadu_ps(s + 16)),
                                    _mm512_max_ps(_mm512_loadu_ps(s + 32), _mm512_loadu_ps(s + 48)));
          const float block_max = _mm512_reduce_max_ps(mx);
          const float new_max = std::max(m[r], block_max);
          if (new_max == ninf) {  // nothing visible yet: the row adds nothing
            std::fill(s, s + BK, 0.f);
            continue;
          }
          const float alpha = m[r] == ninf ? 0.f : std::exp(m[r] - new_max);
          const __m512 nm = _mm512_set1_ps(new_max);
          __m512 sum = _mm512_setzero_ps();
          for (int c = 0; c < BK; c += 16) {
            const __m512 p = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + c), nm));
            _mm512_storeu_ps(s + c, p);
            sum = _mm512_add_ps(sum, p);
          }
          l[r] = l[r] * alpha + _mm512_reduce_add_ps(sum);
          m[r] = new_max;
          if (alpha != 1.f) {
            const __m512 av = _mm512_set1_ps(alpha);
            for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(&o[r * D + d], _mm512_mul_ps(av, _mm512_loadu_ps(&o[r * D + d])));
          }
        }
        // Output: 4 rows x 64 columns per step, each key's values broadcast-multiplied by the rows' weights.
        for (int64_t r0 = 0; r0 < R; r0 += 4)
          for (int64_t d0 = 0; d0 < D; d0 += 64)
            weigh_values(&sc[r0 * BK], &o[r0 * D + d0], vfg + kb * D + d0, D);
      }
      for (int64_t r = 0; r < R; ++r) {
        if (r % BQ >= rows) continue;
        const int64_t h = g * group + r / BQ, t = t0 + r % BQ;
        const float inv = 1.f / l[r];
        for (int64_t d = 0; d < D; ++d) op[(h * T_ + t) * D + d] = o[r * D + d] * inv;
        lp[h * T_ + t] = m[r] + std::log(l[r]);
      }
    }
  });
}

}  // namespace

std::vector<at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t offset,
                                  double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v are (heads, tokens, head_dim)");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1, "head_dim must be contiguous");
  TORCH_CHECK(q.size(0) % k.size(0) == 0, "query heads must be a multiple of key/value heads");
  auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  auto lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  if (q.scalar_type() == at::kFloat) {
    attend<float>(q, k, v, offset, scale, out, lse);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "float32 or bfloat16");
    attend<at::BFloat16>(q, k, v, offset, scale, out, lse);
  }
  return {out, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("attention", &attention); }
