// tests/test_attention.cpp — the streaming attention (kernels/cpu/attention.cpp) over 32- and 16-bit
// KV caches: its scalar, AVX2 and AVX-512 twins give the same bits whatever the rows, chunks and
// threads; a 16-bit cache reads exactly the values it holds; results are close to a float64
// softmax(QKᵀ)V; the cache rounds what it stores to nearest even.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant.hpp"
#include "model/kv_cache.hpp"

using namespace specactor::kernels;
using specactor::model::KvCache;

namespace {

// One layer's cache of `slots` random rows in `type`, and random queries.
struct Case {
  KvCache kv;
  KvCache::Seq seq;
  std::vector<float> q;
  std::int64_t heads, kvh, hd;
  Case(KvType type, std::int64_t heads_, std::int64_t kvh_, std::int64_t hd_, std::int64_t page, std::int64_t slots,
       std::int64_t nq, std::uint32_t seed, float spread = 1.0f)
      : kv(1, kvh_, hd_, page, (slots / page + 2) * page, true, type),
        q(static_cast<std::size_t>(nq * heads_ * hd_)),
        heads(heads_),
        kvh(kvh_),
        hd(hd_) {
    kv.reserve(seq, slots);
    seq.length = slots;
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, spread);
    std::vector<float> k(static_cast<std::size_t>(kvh * hd)), v(k.size());
    for (std::int64_t s = 0; s < slots; ++s) {
      for (std::size_t i = 0; i < k.size(); ++i) k[i] = d(rng), v[i] = d(rng);
      kv.write(0, seq, s, k.data(), v.data());
    }
    for (auto& x : q) x = d(rng);
  }
};

const KvType kTypes[] = {KvType::F32, KvType::F16, KvType::BF16};

std::vector<int> paths_here() {
  std::vector<int> p = {0};
  if (cpu_path_available(CpuPath::Avx2)) p.push_back(1);
  if (cpu_path_available(CpuPath::Avx512)) p.push_back(2);
  return p;
}

std::vector<float> run(int path, int threads, const std::vector<AttentionJob>& jobs_in, std::int64_t heads,
                       std::int64_t kvh, std::int64_t hd, std::vector<std::vector<float>>& outs) {
  std::vector<AttentionJob> jobs = jobs_in;
  outs.assign(jobs.size(), {});
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    outs[j].assign(static_cast<std::size_t>(jobs[j].n_q * heads * hd), -7.0f);
    jobs[j].out = outs[j].data();
  }
  attention_many_path(path, threads, jobs.data(), static_cast<int>(jobs.size()), heads, kvh, hd, 0.125f);
  std::vector<float> all;
  for (const auto& o : outs) all.insert(all.end(), o.begin(), o.end());
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("attention: scalar, AVX2 and AVX-512 twins give the same bits for every KV type, shape and thread split") {
  // (head_dim, keys, queries, tree mask?): long decodes cross several chunks (512 keys) whose
  // states are merged; 40 causal rows form runs with shared and per-row tiles; head_dim 48 runs
  // the AVX-512 path without a whole 64-column group, 40 the AVX2 path only, 20 the scalar only.
  struct Shape {
    std::int64_t hd, keys, nq;
    bool tree;
  };
  // Runs of up to 8 rows read their whole prefix blocks in place, row by row, and the rest (a partial
  // block and the new keys, 18 of them at 690 keys) through the tile; longer runs read every block
  // through the tile. Row counts of 5, 9, 17 and 25 leave a short run after runs of 4 or 8 (whatever
  // the run size), so both kinds meet in one call.
  const Shape shapes[] = {{64, 1300, 1, false}, {64, 700, 40, false}, {64, 600, 6, true},  {64, 690, 5, false},
                          {64, 690, 5, true},   {64, 690, 9, false},  {64, 700, 17, true}, {64, 90, 25, false},
                          {48, 530, 3, false},  {40, 90, 5, true},    {20, 70, 2, false}};
  // A binary tree over up to 64 nodes: node i's parent is (i − 1) / 2; each row sees its ancestors.
  std::uint64_t tree[64];
  for (int i = 0; i < 64; ++i) tree[i] = (i == 0 ? 0 : tree[(i - 1) / 2]) | (std::uint64_t{1} << i);
  const auto paths = paths_here();
  for (const KvType type : kTypes)
    for (const Shape& sh : shapes) {
      CAPTURE(kv_type_name(type));
      CAPTURE(sh.hd);
      CAPTURE(sh.keys);
      CAPTURE(sh.nq);
      Case a(type, 9, 3, sh.hd, 16, sh.keys, sh.nq, static_cast<std::uint32_t>(sh.keys + sh.nq));
      Case b(type, 9, 3, sh.hd, 16, 37, 1, 5);  // a second, short sequence in the same call
      const auto va = a.kv.view(0, a.seq), vb = b.kv.view(0, b.seq);
      const std::vector<AttentionJob> jobs = {{a.q.data(),
                                               sh.nq,
                                               {va, 0, sh.keys - sh.nq},
                                               {va, sh.keys - sh.nq, sh.nq},
                                               sh.tree ? tree : nullptr,
                                               nullptr},
                                              {b.q.data(), 1, {vb, 0, 36}, {vb, 36, 1}, nullptr, nullptr}};
      std::vector<std::vector<float>> outs;
      const std::vector<float> ref = run(0, 1, jobs, 9, 3, sh.hd, outs);
      for (const float x : ref) REQUIRE(std::isfinite(x));
      for (const int path : paths)
        for (const int threads : {1, 2, 3, 5}) {
          CAPTURE(path);
          CAPTURE(threads);
          CHECK(same_bits(run(path, threads, jobs, 9, 3, sh.hd, outs), ref));
        }
      // Each query alone (decode of one row, the verify of one tree node) gets its bits in the batch.
      for (std::int64_t i = 0; i < sh.nq; i += (sh.nq > 8 ? 4 : 1)) {
        const std::int64_t pre = sh.keys - sh.nq;
        const AttentionJob one =
            sh.tree ? AttentionJob{a.q.data() + i * 9 * sh.hd, 1, {va, 0, pre}, {va, pre, sh.nq}, tree + i, nullptr}
                    : AttentionJob{a.q.data() + i * 9 * sh.hd, 1, {va, 0, pre + i}, {va, pre + i, 1}, nullptr, nullptr};
        const std::vector<float> alone = run(paths.back(), 2, {one}, 9, 3, sh.hd, outs);
        CHECK(std::memcmp(alone.data(), ref.data() + i * 9 * sh.hd, alone.size() * sizeof(float)) == 0);
      }
    }
}

TEST_CASE("attention: causal rows give the same bits however the keys before them are split into a prefix") {
  // A prefix-cache hit or a prefill chunk: rows [pre, N) over a prefix of `pre` keys must give the
  // bits those rows get in one causal batch of all N, on every path and thread split.
  for (const KvType type : kTypes)
    for (const std::int64_t N : {66, 90, 700})
      for (const std::int64_t pre : {9, 16, 25, 33, 49, 64, 530}) {
        if (pre >= N) continue;
        CAPTURE(kv_type_name(type));
        CAPTURE(N);
        CAPTURE(pre);
        Case c(type, 9, 3, 64, 16, N, N, static_cast<std::uint32_t>(N * 100 + pre));
        const auto v = c.kv.view(0, c.seq);
        std::vector<std::vector<float>> outs;
        const std::vector<float> whole =
            run(0, 1, {{c.q.data(), N, {v, 0, 0}, {v, 0, N}, nullptr, nullptr}}, 9, 3, 64, outs);
        for (const int path : paths_here())
          for (const int threads : {1, 2, 3}) {
            CAPTURE(path);
            CAPTURE(threads);
            const std::vector<float> part = run(
                path, threads, {{c.q.data() + pre * 9 * 64, N - pre, {v, 0, pre}, {v, pre, N - pre}, nullptr, nullptr}},
                9, 3, 64, outs);
            CHECK(std::memcmp(part.data(), whole.data() + pre * 9 * 64, part.size() * sizeof(float)) == 0);
          }
      }
}

TEST_CASE("attention: a 16-bit cache gives the bits of a float32 cache holding its rounded values") {
  for (const KvType type : {KvType::F16, KvType::BF16}) {
    CAPTURE(kv_type_name(type));
    const std::int64_t slots = 300, nq = 5, hd = 64;
    Case h(type, 9, 3, hd, 16, slots, nq, 21, 3.0f);
    // The same rows as the 16-bit cache reads them back, in a float32 cache.
    KvCache f(1, 3, hd, 16, (slots / 16 + 2) * 16, true, KvType::F32);
    KvCache::Seq fs;
    f.reserve(fs, slots);
    fs.length = slots;
    std::vector<float> k(3 * hd), v(k.size());
    for (std::int64_t s = 0; s < slots; ++s) {
      h.kv.read(0, h.seq, s, k.data(), v.data());
      f.write(0, fs, s, k.data(), v.data());
    }
    const auto vh = h.kv.view(0, h.seq), vf = f.view(0, fs);
    std::vector<std::vector<float>> outs;
    for (const int path : paths_here()) {
      CAPTURE(path);
      const auto a =
          run(path, 2, {{h.q.data(), nq, {vh, 0, slots - nq}, {vh, slots - nq, nq}, nullptr, nullptr}}, 9, 3, hd, outs);
      const auto b =
          run(path, 2, {{h.q.data(), nq, {vf, 0, slots - nq}, {vf, slots - nq, nq}, nullptr, nullptr}}, 9, 3, hd, outs);
      CHECK(same_bits(a, b));
    }
  }
}

TEST_CASE("attention: close to a float64 softmax(QKᵀ)V over the values the cache holds, mixed segment types") {
  // FROZEN_KV_MTP's shape: the prefix in the target's 16-bit cache, the masked keys in float rows
  // with the heads side by side (a drafter's scratch).
  const std::int64_t heads = 9, kvh = 3, hd = 64, pre = 1100, nq = 4, row = kvh * hd;
  Case c(KvType::F16, heads, kvh, hd, 16, pre, nq, 31, 2.0f);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> sk(static_cast<std::size_t>(nq * row)), sv(sk.size());
  for (auto& x : sk) x = d(rng);
  for (auto& x : sv) x = d(rng);
  const std::int32_t page0 = 0;
  const PagedKvView scratch{sk.data(), sv.data(), &page0, 64, 64 * row, row};
  const std::uint64_t mask[4] = {0b1, 0b11, 0b101, 0b1011};
  const std::vector<AttentionJob> jobs = {
      {c.q.data(), nq, {c.kv.view(0, c.seq), 0, pre}, {scratch, 0, nq}, mask, nullptr}};
  std::vector<std::vector<float>> outs;
  const auto paths = paths_here();
  const std::vector<float> got = run(paths.back(), 2, jobs, heads, kvh, hd, outs);
  CHECK(same_bits(run(0, 1, jobs, heads, kvh, hd, outs), got));
  std::vector<float> k(static_cast<std::size_t>(row)), v(k.size());
  std::vector<std::vector<double>> K, V;
  for (std::int64_t s = 0; s < pre; ++s) {
    c.kv.read(0, c.seq, s, k.data(), v.data());
    K.emplace_back(k.begin(), k.end());
    V.emplace_back(v.begin(), v.end());
  }
  double worst = 0.0;
  for (std::int64_t i = 0; i < nq; ++i)
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t g = h / (heads / kvh);
      std::vector<const double*> ks, vs;
      std::vector<std::vector<double>> extra_k, extra_v;
      for (std::int64_t s = 0; s < pre; ++s) ks.push_back(K[s].data() + g * hd), vs.push_back(V[s].data() + g * hd);
      for (std::int64_t m = 0; m < nq; ++m)
        if ((mask[i] >> m) & 1u) {
          extra_k.emplace_back(sk.begin() + m * row + g * hd, sk.begin() + m * row + (g + 1) * hd);
          extra_v.emplace_back(sv.begin() + m * row + g * hd, sv.begin() + m * row + (g + 1) * hd);
        }
      for (std::size_t e = 0; e < extra_k.size(); ++e) ks.push_back(extra_k[e].data()), vs.push_back(extra_v[e].data());
      std::vector<double> sc(ks.size());
      double mx = -1e300;
      for (std::size_t t = 0; t < ks.size(); ++t) {
        double dot = 0;
        for (std::int64_t x = 0; x < hd; ++x) dot += static_cast<double>(c.q[(i * heads + h) * hd + x]) * ks[t][x];
        sc[t] = dot * 0.125;
        mx = std::max(mx, sc[t]);
      }
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (std::int64_t x = 0; x < hd; ++x) {
        double o = 0;
        for (std::size_t t = 0; t < ks.size(); ++t) o += sc[t] / sum * vs[t][x];
        worst = std::max(worst, std::fabs(o - got[(i * heads + h) * hd + x]));
      }
    }
  MESSAGE("attention vs float64: worst absolute error " << worst);
  CHECK(worst < 2e-5);
}

TEST_CASE("KV cache: 16-bit rows round to nearest even, read back exactly, copy_slot moves every head") {
  for (const KvType type : {KvType::F16, KvType::BF16}) {
    CAPTURE(kv_type_name(type));
    KvCache kv(2, 3, 16, 16, 64, true, type);
    CHECK(kv.bytes_per_token() == 2 * 2 * 3 * 16 * 2);
    KvCache::Seq s;
    kv.reserve(s, 40);
    s.length = 40;
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 10.0f);
    std::vector<float> k(48), v(48), rk(48), rv(48);
    for (auto& x : k) x = d(rng);
    for (auto& x : v) x = d(rng);
    k[0] = 1.0f + 1.0f / 4096, k[1] = 70000.0f, v[0] = -0.0f;
    kv.write(1, s, 17, k.data(), v.data());
    kv.read(1, s, 17, rk.data(), rv.data());
    for (std::size_t i = 0; i < k.size(); ++i) {
      const float want_k = type == KvType::F16 ? f16_to_f32(f32_to_f16(k[i])) : bf16_to_f32(f32_to_bf16(k[i]));
      const float want_v = type == KvType::F16 ? f16_to_f32(f32_to_f16(v[i])) : bf16_to_f32(f32_to_bf16(v[i]));
      CHECK(std::memcmp(&rk[i], &want_k, 4) == 0);
      CHECK(std::memcmp(&rv[i], &want_v, 4) == 0);
    }
    if (type == KvType::F16) {
      CHECK(rk[0] == 1.0f);        // halfway rounds to even
      CHECK(std::isinf(rk[1]));    // beyond the half range
      CHECK(std::signbit(rv[0]));  // -0 kept
    }
    kv.copy_slot(s, 17, 33);
    std::vector<float> ck(48), cv(48);
    kv.read(1, s, 33, ck.data(), cv.data());
    CHECK(ck == rk);
    CHECK(cv == rv);
  }
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)) == 1.0f);  // halfway, to even
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST_CASE("16-bit conversions: the SIMD path writes the scalar conversions' bits for every kind of float") {
  // Inputs chosen where the rounding is decided: for every sign, exponent and top mantissa bits, the
  // low bits at zero, one, just below/at/above the halfway point and all ones, for both the normal
  // range and every subnormal shift of float16; NaNs with payloads and infinities come with exponent
  // 0xff; then random patterns.
  std::vector<std::uint32_t> bits;
  for (std::uint32_t hi = 0; hi < (1u << 19); ++hi)
    for (const std::uint32_t lo : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu}) bits.push_back(hi << 13 | lo);
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t exp = 101; exp <= 113; ++exp)  // float16's subnormal results and the edges
      for (std::uint32_t top = 0; top < 64; ++top) {
        const int shift = 126 - static_cast<int>(exp);  // the bits below float16's last subnormal bit (+13)
        const std::uint32_t full = (1u << 23) - 1, base = top << 17;
        for (const std::uint32_t lo :
             {0u, 1u, full, shift > 0 ? (1u << (shift + 13 - 1)) : 0u, shift > 0 ? (1u << (shift + 13 - 1)) + 1 : 1u,
              shift > 0 ? (1u << (shift + 13 - 1)) - 1 : 2u})
          bits.push_back(sign << 31 | exp << 23 | ((base | (lo & full)) & full));
      }
  for (std::uint32_t hi = 0; hi < (1u << 16); ++hi)  // bfloat16's halfway points
    for (const std::uint32_t lo : {0x7fffu, 0x8000u, 0x8001u, 0xffffu}) bits.push_back(hi << 16 | lo);
  std::mt19937 rng(11);
  for (int i = 0; i < 1 << 20; ++i) bits.push_back(static_cast<std::uint32_t>(rng()));
  bits.resize(bits.size() + 5, 0x3f800000u);  // a length that leaves a tail for the scalar loop
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * 4);
  std::vector<std::uint16_t> s(x.size()), v(x.size());
  for (const bool bf : {false, true}) {
    CAPTURE(bf);
    (bf ? f32_to_bf16_n : f32_to_f16_n)(x.data(), s.data(), x.size(), false);
    (bf ? f32_to_bf16_n : f32_to_f16_n)(x.data(), v.data(), x.size(), true);
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (s[i] != v[i] && bad++ == 0) first = i;
    CAPTURE(first);
    CAPTURE(bits[first]);
    CHECK(bad == 0);
  }
  // The scalar conversions themselves, at points whose answers are known.
  CHECK(f32_to_f16(65504.0f) == 0x7bff);
  CHECK(f32_to_f16(65520.0f) == 0x7c00);               // halfway to the next binade: to even = inf
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // the smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // half of it: to even = 0
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);  // above half
  CHECK(f32_to_f16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 subnormal units: to even = 2
  std::uint32_t nan_bits = 0xffc12345u;                // a negative quiet NaN with a payload
  float nan_f;
  std::memcpy(&nan_f, &nan_bits, 4);
  CHECK(f32_to_f16(nan_f) == (0x8000 | 0x7c00 | 0x200 | (0x412345u >> 13)));
  if (!cpu_path_available(CpuPath::Avx2)) MESSAGE("no AVX2 + F16C here: only the scalar conversion ran");
}
