// sched/budget.cpp — see budget.hpp.
#include "sched/budget.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specactor::sched {

// --- RingMedian ------------------------------------------------------------------------------------

void RingMedian::add(double v, std::int64_t stamp) {
  if (!std::isfinite(v) || v < 0) return;
  if (n_ == kCap) {  // the oldest makes room
    std::move(v_.begin() + 1, v_.end(), v_.begin());
    std::move(t_.begin() + 1, t_.end(), t_.begin());
    --n_;
  }
  v_[n_] = v;
  t_[n_++] = stamp;
}

std::size_t RingMedian::size(std::int64_t since) const {
  std::size_t k = 0;
  for (std::size_t i = 0; i < n_; ++i) k += t_[i] >= since;
  return k;
}

double RingMedian::median(std::int64_t since) const {
  std::array<double, kCap> s{};
  std::size_t k = 0;
  for (std::size_t i = 0; i < n_; ++i)
    if (t_[i] >= since) s[k++] = v_[i];
  if (k == 0) return 0;
  std::sort(s.begin(), s.begin() + static_cast<long>(k));
  return k % 2 ? s[k / 2] : 0.5 * (s[k / 2 - 1] + s[k / 2]);
}

// --- CostModel -------------------------------------------------------------------------------------

namespace {

// The upper median (what nth_element puts in the middle); v is reordered. v must not be empty.
double upper_median(std::vector<double>& v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Theil–Sen's slope: the median of the slopes between every two points of different x; `none` when
// there is no such pair.
double median_slope(const std::vector<std::pair<double, double>>& pts, double none) {
  std::vector<double> slopes;
  for (std::size_t i = 0; i < pts.size(); ++i)
    for (std::size_t j = i + 1; j < pts.size(); ++j)
      if (pts[j].first != pts[i].first)
        slopes.push_back((pts[j].second - pts[i].second) / (pts[j].first - pts[i].first));
  return slopes.empty() ? none : upper_median(slopes);
}

}  // namespace

int CostModel::band_of(double c) { return c < 1024 ? 0 : c < 4096 ? 1 : c < 16384 ? 2 : 3; }

int CostModel::bucket_of(std::int64_t rows) {
  if (rows <= 1) return 0;
  if (rows <= 32) return static_cast<int>(rows - 1);
  if (rows <= 64) return 32 + static_cast<int>((rows - 33) / 8);             // 40, 48, 56, 64
  if (rows <= 256) return 36 + static_cast<int>((rows - 65) / 32);           // 96 .. 256
  return std::min(kBuckets - 1, 42 + static_cast<int>((rows - 257) / 128));  // 384 ..
}

std::int64_t CostModel::bucket_rows(int b) {
  if (b < 32) return b + 1;
  if (b < 36) return 40 + 8 * (b - 32);
  if (b < 42) return 96 + 32 * (b - 36);
  return 384 + 128 * (b - 42);
}

void CostModel::seed(std::int64_t rows, double ms) {
  if (rows < 1 || !std::isfinite(ms) || ms <= 0) return;
  const int b = bucket_of(rows);
  cells_[0][static_cast<std::size_t>(b)].seeded = ms * static_cast<double>(bucket_rows(b)) / static_cast<double>(rows);
  fresh_.fill(false);
}

void CostModel::observe_step(std::int64_t rows, double mean_context, double ms) {
  if (rows < 1 || !std::isfinite(ms) || ms <= 0) return;
  const int b = bucket_of(rows);
  const int band = band_of(mean_context);
  // A bucket above 32 holds several row counts: scale to its representative (linear there).
  cells_[static_cast<std::size_t>(band)][static_cast<std::size_t>(b)].real.add(
      ms * static_cast<double>(bucket_rows(b)) / static_cast<double>(rows), ++steps_);
  fresh_.fill(false);
}

// A cell's estimate; a band that never saw this bucket borrows the shape of one that did, scaled at a
// bucket both know.
double CostModel::band_estimate(int band, int bucket) const {
  const auto& row = cells_[static_cast<std::size_t>(band)];
  if (const double e = row[static_cast<std::size_t>(bucket)].estimate(since()); e > 0) return e;
  for (int dist = 1; dist < kBands; ++dist)
    for (int other : {band - dist, band + dist}) {
      if (other < 0 || other >= kBands) continue;
      const auto& ref = cells_[static_cast<std::size_t>(other)];
      const double target = ref[static_cast<std::size_t>(bucket)].estimate(since());
      if (target <= 0) continue;
      // the bucket nearest to `bucket` that both bands know
      for (int d = 0; d < kBuckets; ++d)
        for (int j : {bucket - d, bucket + d}) {
          if (j < 0 || j >= kBuckets) continue;
          const double mine = row[static_cast<std::size_t>(j)].estimate(since());
          const double theirs = ref[static_cast<std::size_t>(j)].estimate(since());
          if (mine > 0 && theirs > 0) return mine * target / theirs;
        }
    }
  return -1;
}

// A line through the band's bucket estimates, fitted robustly (Theil–Sen: the median of the slopes
// between every two buckets, then the median intercept), so one noisy or stale bucket cannot bend the
// whole curve; each bucket's estimate is itself a median of recent steps (or the probe's value).
const CostModel::Line& CostModel::line(int band) const {
  Line& l = lines_[static_cast<std::size_t>(band)];
  if (fresh_[static_cast<std::size_t>(band)]) return l;
  std::vector<std::pair<double, double>> pts;
  for (int b = 0; b < kBuckets; ++b)
    if (const double e = band_estimate(band, b); e > 0) pts.emplace_back(static_cast<double>(bucket_rows(b)), e);
  l = {};
  if (pts.size() == 1) {
    l = {0.0, pts[0].second / pts[0].first, true};  // one point: proportional, the most a row can cost
  } else if (pts.size() > 1) {                      // buckets have distinct row counts: every pair has a slope
    const double slope = std::max(0.0, median_slope(pts, 0.0));
    std::vector<double> cuts;
    for (const auto& [r, t] : pts) cuts.push_back(t - slope * r);
    l = {upper_median(cuts), slope, true};
  }
  // The prediction per bucket: where real steps have measured it (three or more), their median;
  // elsewhere the line; never less than a smaller bucket's.
  auto& pred = preds_[static_cast<std::size_t>(band)];
  const auto& row = cells_[static_cast<std::size_t>(band)];
  double running = 0;
  for (int b = 0; b < kBuckets; ++b) {
    const Cell& c = row[static_cast<std::size_t>(b)];
    const double v = c.real.size(since()) >= 3 ? c.real.median(since())
                     : l.known                 ? l.a + l.b * static_cast<double>(bucket_rows(b))
                                               : 0;
    running = std::max(running, v);
    pred[static_cast<std::size_t>(b)] = running;
  }
  slopes_[static_cast<std::size_t>(band)].fill(-1.0);
  fresh_[static_cast<std::size_t>(band)] = true;
  return l;
}

bool CostModel::known() const {
  for (int b = 0; b < kBands; ++b)
    if (line(b).known) return true;
  return false;
}

double CostModel::step_ms(std::int64_t rows, double mean_context) const {
  const int band = band_of(mean_context);
  const Line& l = line(band);
  if (!l.known) return 0;
  const auto& pred = preds_[static_cast<std::size_t>(band)];
  const std::int64_t r = std::max<std::int64_t>(rows, 1);
  const int b = bucket_of(r);
  double v;
  if (r <= 32 || b == kBuckets - 1) {
    v = pred[static_cast<std::size_t>(b)];
    if (r > bucket_rows(b)) v += l.b * static_cast<double>(r - bucket_rows(b));  // past the last bucket
  } else {                                                                       // between two buckets' representatives
    const double r1 = static_cast<double>(bucket_rows(b)), r0 = static_cast<double>(bucket_rows(b - 1));
    const double t1 = pred[static_cast<std::size_t>(b)], t0 = pred[static_cast<std::size_t>(b - 1)];
    v = t0 + (t1 - t0) * (static_cast<double>(r) - r0) / (r1 - r0);
  }
  return std::max(v, 1e-3);
}

double CostModel::local_slope(int band, std::int64_t rows) const {
  const Line& l = line(band);  // refreshes the predictions (and clears the slopes) when stale
  const int bucket = bucket_of(std::max<std::int64_t>(rows, 1));
  double& cached = slopes_[static_cast<std::size_t>(band)][static_cast<std::size_t>(bucket)];
  if (cached >= 0) return cached;
  const std::int64_t lo = std::max<std::int64_t>(1, rows / 2), hi = 2 * rows + 4;
  std::vector<std::pair<double, double>> pts;
  for (int b = 0; b < kBuckets; ++b) {
    const std::int64_t r = bucket_rows(b);
    if (r < lo || r > hi) continue;
    if (const double e = band_estimate(band, b); e > 0) pts.emplace_back(static_cast<double>(r), e);
  }
  cached = std::max(0.0, median_slope(pts, l.b));
  return cached;
}

double CostModel::extra_ms(std::int64_t base_rows, std::int64_t rows, double mean_context) const {
  if (rows <= base_rows) return 0.0;
  const int band = band_of(mean_context);
  if (!line(band).known) return 0.0;
  const double diff = step_ms(rows, mean_context) - step_ms(base_rows, mean_context);
  return std::max(diff, local_slope(band, base_rows) * static_cast<double>(rows - base_rows));
}

double CostModel::relative(std::int64_t rows, double mean_context) const {
  const double one = step_ms(1, mean_context);
  return one > 0 ? step_ms(rows, mean_context) / one : 1.0;
}

void CostModel::observe_draft(std::int64_t levels, double ms, bool priming) {
  if (levels <= 0 || !std::isfinite(ms) || ms < 0 || priming) return;
  draft_obs_[static_cast<std::size_t>(draft_rounds_ % 32)] = {static_cast<double>(levels), ms};
  ++draft_rounds_;
  draft_fresh_ = false;
}

double CostModel::draft_ms(std::int64_t levels) const {
  if (levels <= 0 || draft_rounds_ == 0) return 0.0;
  if (!draft_fresh_) {
    const auto n = static_cast<std::size_t>(std::min<std::int64_t>(draft_rounds_, 32));
    const std::vector<std::pair<double, double>> pts(draft_obs_.begin(), draft_obs_.begin() + static_cast<long>(n));
    const bool same = std::all_of(pts.begin(), pts.end(), [&](const auto& p) { return p.first == pts.front().first; });
    draft_same_ = same ? pts.front().first : -1;
    draft_b_ = std::max(0.0, median_slope(pts, 0.0));
    std::vector<double> cuts;
    for (const auto& [levels_i, ms] : pts) cuts.push_back(ms - draft_b_ * levels_i);
    draft_a_ = std::max(0.0, upper_median(cuts));
    draft_own_.clear();
    for (const auto& pt : pts) {
      const double lv = pt.first;
      if (std::any_of(draft_own_.begin(), draft_own_.end(), [&](const auto& o) { return o.first == lv; })) continue;
      std::vector<double> same_level;
      for (const auto& [l2, ms2] : pts)
        if (l2 == lv) same_level.push_back(ms2);
      if (same_level.size() >= 3) draft_own_.emplace_back(lv, upper_median(same_level));
    }
    draft_fresh_ = true;
  }
  for (const auto& [lv, ms] : draft_own_)
    if (lv == static_cast<double>(levels)) return ms;
  if (draft_same_ > 0)
    return one_pass_ ? draft_a_ : draft_a_ * std::max(1.0, static_cast<double>(levels) / draft_same_);
  return draft_a_ + draft_b_ * static_cast<double>(levels);
}

// --- AcceptanceModel -------------------------------------------------------------------------------

namespace {

constexpr std::array<float, 11> kEdges{0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.3f, 0.2f, 0.1f, 0.05f, 0.02f};
constexpr double kRequestDecay = 0.9;  // per verified node / proposal: recent behaviour of a request
constexpr double kGlobalCap = 4000;    // global cells halve past this many observations (slow drift)

double prior_none(int depth) { return std::pow(0.6, depth); }

}  // namespace

int AcceptanceModel::score_bin(float score) {
  if (!(score >= 0)) return kScoreBins;
  for (int i = 0; i < static_cast<int>(kEdges.size()); ++i)
    if (score >= kEdges[static_cast<std::size_t>(i)]) return i;
  return static_cast<int>(kEdges.size());
}

double AcceptanceModel::node_prob(float score, int depth, const RequestAcceptance& r) const {
  const int d = std::clamp(depth, 1, kMaxDepth);
  const int bin = score_bin(score);
  const Beta& c = table_[static_cast<std::size_t>(bin)][static_cast<std::size_t>(d)];
  const double prior = bin == kScoreBins ? prior_none(d) : static_cast<double>(score);
  const double base = (c.hits + 4.0 * prior) / (c.seen + 4.0);
  return std::clamp(base * std::clamp(r.factor(), 0.25, 2.5), 0.0, 0.98);
}

// P(reach d) = Π q_j, q_j = P(depth j accepted | depth j-1 was). Each q_j is estimated from the
// steps that reached depth j-1 and drafted depth j, first over all requests (a level not seen yet
// takes the level above's estimate as its prior: acceptance rarely collapses with depth; the first
// level takes 0.6); for a request whose last draft was taken whole, over the steps that followed
// such a draft where that is higher (the estimate over all its prior: measured, a lower one made
// EAGLE-3 skip drafts that paid); then over this request's own recent counts (decayed; the engine's
// estimate their prior).
double AcceptanceModel::level_prob(int depth, const RequestAcceptance& r) const {
  const int D = std::clamp(depth, 1, kMaxDepth);
  double p = 1.0, g_prev = 0.6, r_prev = 0.6;
  for (int d = 1; d <= D; ++d) {
    const auto i = static_cast<std::size_t>(d);
    const Beta& g = levels_[i];
    const double pooled = (g.hits + 2.0 * g_prev) / (g.seen + 2.0);
    const Beta& w = after_whole_[i];
    const double gq = r.last_whole ? std::max(pooled, (w.hits + 2.0 * pooled) / (w.seen + 2.0)) : pooled;
    const double rq =
        (r.level_hits[i] + 3.0 * (d == 1 ? gq : std::min(gq, r_prev) * 0.5 + gq * 0.5)) / (r.level_seen[i] + 3.0);
    p *= rq;
    g_prev = pooled;
    r_prev = rq;
  }
  return p;
}

int AcceptanceModel::round_bin(std::int64_t empty) {
  if (empty < 0) return 0;
  if (empty <= 2) return static_cast<int>(empty) + 1;
  return empty <= 4 ? 4 : empty <= 8 ? 5 : empty <= 16 ? 6 : 7;
}

double AcceptanceModel::propose_prob(const RequestAcceptance& r) const {
  const int bin = round_bin(r.empty_rounds);
  const auto at = [&](int b) -> const Beta& { return rounds_[static_cast<std::size_t>(b)]; };
  if (bin == 0) return (at(0).hits + 1.0) / (at(0).seen + 1.0);  // a drafter proposes until shown otherwise
  double q = (at(1).hits + 1.0) / (at(1).seen + 1.0);
  for (int b = 2; b <= bin; ++b) q = (at(b).hits + q) / (at(b).seen + 1.0);
  return q;
}

void AcceptanceModel::observe_round(bool proposed, RequestAcceptance& r) {
  Beta& g = rounds_[static_cast<std::size_t>(round_bin(r.empty_rounds))];
  if (g.seen >= kGlobalCap) g.hits *= 0.5, g.seen *= 0.5;
  g.seen += 1;
  g.hits += proposed ? 1 : 0;
  r.empty_rounds = proposed ? 0 : std::max<std::int64_t>(0, r.empty_rounds) + 1;
}

void AcceptanceModel::observe_node(float score, int depth, double predicted, bool accepted, RequestAcceptance& r) {
  const int d = std::clamp(depth, 1, kMaxDepth);
  Beta& c = table_[static_cast<std::size_t>(score_bin(score))][static_cast<std::size_t>(d)];
  if (c.seen >= kGlobalCap) c.hits *= 0.5, c.seen *= 0.5;
  c.seen += 1;
  c.hits += accepted ? 1 : 0;
  r.observed = kRequestDecay * r.observed + (accepted ? 1 : 0);
  r.predicted = kRequestDecay * r.predicted + predicted;
  const auto b = static_cast<std::size_t>(std::clamp(static_cast<int>(predicted * 10), 0, 9));
  cal_pred_[b] += predicted;
  cal_obs_[b] += accepted ? 1 : 0;
  cal_n_[b] += 1;
  if (score >= 0.0f && score <= 1.0f) {
    const auto s = static_cast<std::size_t>(std::clamp(static_cast<int>(score * 10), 0, 9));
    score_pred_[s] += score;
    score_obs_[s] += accepted ? 1 : 0;
    score_n_[s] += 1;
  }
}

void AcceptanceModel::observe_levels(int drafted, int accepted, RequestAcceptance& r) {
  for (std::size_t i = 1; i < r.level_seen.size(); ++i) {
    r.level_seen[i] *= kRequestDecay;
    r.level_hits[i] *= kRequestDecay;
  }
  for (int d = 1; d <= std::min({drafted, accepted + 1, kMaxDepth}); ++d) {  // depths whose parent was accepted
    const auto i = static_cast<std::size_t>(d);
    r.level_seen[i] += 1;
    r.level_hits[i] += accepted >= d ? 1 : 0;
    for (Beta* g : {&levels_[i], r.last_whole ? &after_whole_[i] : nullptr}) {
      if (!g) continue;
      if (g->seen >= kGlobalCap) g->hits *= 0.5, g->seen *= 0.5;
      g->seen += 1;
      g->hits += accepted >= d ? 1 : 0;
    }
  }
  if (drafted > 0) r.last_whole = accepted >= drafted;
}

namespace {

// Expected calibration error over ten bins: Σ_b (n_b/n)·|mean prediction − observed rate| = Σ_b |Σ pred − Σ obs| / n.
double binned_error(const std::array<double, 10>& pred, const std::array<double, 10>& obs,
                    const std::array<double, 10>& n_b) {
  const double n = std::accumulate(n_b.begin(), n_b.end(), 0.0);
  if (n <= 0) return 0;
  double e = 0;
  for (std::size_t b = 0; b < n_b.size(); ++b)
    if (n_b[b] > 0) e += std::abs(pred[b] - obs[b]) / n;
  return e;
}

}  // namespace

double AcceptanceModel::calibration_count() const { return std::accumulate(cal_n_.begin(), cal_n_.end(), 0.0); }
double AcceptanceModel::calibration_error() const { return binned_error(cal_pred_, cal_obs_, cal_n_); }
double AcceptanceModel::score_calibration_count() const {
  return std::accumulate(score_n_.begin(), score_n_.end(), 0.0);
}
double AcceptanceModel::score_calibration_error() const { return binned_error(score_pred_, score_obs_, score_n_); }

// --- Feedback --------------------------------------------------------------------------------------

int Feedback::bucket_of(std::int64_t n) { return n <= 1 ? 0 : n == 2 ? 1 : n <= 4 ? 2 : n <= 8 ? 3 : n <= 16 ? 4 : 5; }

void Feedback::observe(std::int64_t requests, double tokens, double ms, bool drafted) {
  if (requests < 1 || !(ms > 0) || !(tokens > 0) || !std::isfinite(ms)) return;
  Bucket& b = b_[static_cast<std::size_t>(bucket_of(requests))];
  if (!drafted) {
    b.plain.add(tokens, ms, kPlainKeep);
    b.since_plain = 0;
    ++b.since_spec;
    if (b.gain() >= 1.0 || b.since_spec >= kStale) b.scale = std::max(1.0, b.scale * 0.995);
    return;
  }
  if (b.since_spec >= kStale) b.spec = Rate{};  // the last drafted steps are old: measure afresh
  b.since_spec = 0;
  b.spec.add(tokens, ms, kSpecKeep);
  ++b.since_plain;
  const double g = b.gain();  // 1 until enough steps were seen: one odd step is not a measurement
  if (g < 1.0)
    b.scale = std::min(4.0, b.scale * 1.05);
  else if (g > 1.05)
    b.scale = std::max(1.0, b.scale * 0.98);
}

double Feedback::measured_gain(std::int64_t requests) const { return at(requests).gain(); }

void note_plan(RequestAcceptance& r, bool probe, std::int32_t depth) {
  if (depth <= 0) {
    ++r.idle_steps;
    if (r.probing) r.probe_interval = std::min<std::int64_t>(64, 2 * r.probe_interval);
    r.probing = false;
    return;
  }
  r.probing = probe;
  if (!probe) r.probe_interval = 4;
  r.idle_steps = 0;
}

// --- the budget ------------------------------------------------------------------------------------

std::vector<std::int32_t> plan_depths(const std::vector<DepthAsk>& asks, std::int64_t base_rows, double base_tokens,
                                      double mean_context, const CostModel& cost, double penalty,
                                      std::int64_t ref_rows) {
  std::vector<std::int32_t> depth(asks.size(), 0);
  if (!cost.known()) {  // nothing measured yet: the full shape
    for (std::size_t i = 0; i < asks.size(); ++i) depth[i] = asks[i].max_depth;
    return depth;
  }
  struct Level {
    std::size_t req;
    std::int32_t d;
    double prob, rows;
  };
  std::vector<Level> levels;
  double tokens = base_tokens, rows = static_cast<double>(base_rows);
  std::int64_t drafted_levels = 0;
  for (std::size_t i = 0; i < asks.size(); ++i) {
    const DepthAsk& a = asks[i];
    double p = 1.0;
    const std::int32_t forced = a.probe ? std::min<std::int32_t>(1, a.max_depth) : 0;
    for (std::int32_t d = 1; d <= a.max_depth; ++d) {
      p = std::min(p, d <= static_cast<std::int32_t>(a.level_probs.size())
                          ? a.level_probs[static_cast<std::size_t>(d - 1)]
                          : 0.0);
      if (d <= forced) {
        tokens += p;
        rows += a.rows_per_level;
        ++drafted_levels;
        depth[i] = d;
      } else {
        levels.push_back({i, d, p, a.rows_per_level});
      }
    }
  }
  std::stable_sort(levels.begin(), levels.end(), [](const Level& x, const Level& y) { return x.prob > y.prob; });
  const double base_ms = cost.step_ms(ref_rows >= 0 ? ref_rows : base_rows, mean_context);
  auto rows_ms = [&](double r) {  // expected rows may be fractional: priced between the two counts
    const auto lo = std::max(base_rows, static_cast<std::int64_t>(std::floor(r + 1e-9)));
    const double f = std::clamp(r - static_cast<double>(lo), 0.0, 1.0), a = cost.extra_ms(base_rows, lo, mean_context);
    return f > 1e-9 ? a + f * (cost.extra_ms(base_rows, lo + 1, mean_context) - a) : a;
  };
  auto rate = [&](double tok, double r, std::int64_t lv) {
    const double extra = rows_ms(r) + cost.draft_ms(lv);
    const double t = base_ms + penalty * extra;
    return t > 0 ? tok / t : 0.0;
  };
  double best = rate(tokens, rows, drafted_levels);
  std::size_t best_k = 0;
  for (std::size_t k = 0; k < levels.size(); ++k) {
    tokens += levels[k].prob;
    rows += levels[k].rows;
    ++drafted_levels;
    if (const double v = rate(tokens, rows, drafted_levels); v > best) best = v, best_k = k + 1;
  }
  for (std::size_t k = 0; k < best_k; ++k) depth[levels[k].req] = std::max(depth[levels[k].req], levels[k].d);
  return depth;
}

std::int64_t probe_every(const CostModel& cost, std::int64_t base_rows, double mean_context, std::int64_t ref_rows) {
  const double step = cost.step_ms(ref_rows >= 0 ? ref_rows : base_rows, mean_context);
  if (!cost.known() || cost.draft_rounds() == 0 || step <= 0) return ProbeGate::kEvery;
  const double probe = cost.draft_ms(1) + cost.extra_ms(base_rows, base_rows + 1, mean_context);
  const double every = std::ceil(probe / (ProbeGate::kShare * step));
  return static_cast<std::int64_t>(
      std::clamp(every, static_cast<double>(ProbeGate::kEvery), static_cast<double>(ProbeGate::kMaxEvery)));
}

bool probe_pays(std::int32_t max_depth, std::int64_t base_rows, double base_tokens, double mean_context,
                const CostModel& cost, std::int64_t ref_rows) {
  DepthAsk best_case;
  best_case.max_depth = std::max<std::int32_t>(1, max_depth);
  for (std::int32_t d = 1; d <= best_case.max_depth; ++d) best_case.level_probs.push_back(std::pow(0.8, d));
  const std::int32_t d = plan_depths({best_case}, base_rows, base_tokens, mean_context, cost, 1.0, ref_rows)[0];
  if (d <= 0) return false;
  if (!cost.known()) return true;
  double tokens = base_tokens;
  for (std::int32_t k = 1; k <= d; ++k) tokens += std::pow(0.8, k);
  const double base_ms = cost.step_ms(ref_rows >= 0 ? ref_rows : base_rows, mean_context);
  const double ms = base_ms + cost.extra_ms(base_rows, base_rows + d, mean_context) + cost.draft_ms(d);
  return tokens / ms >= kProbeMargin * base_tokens / base_ms;
}

std::vector<bool> select_nodes(const std::vector<Candidate>& nodes, std::int64_t base_rows, double base_tokens,
                               double mean_context, const CostModel& cost, double spent_ms, double penalty,
                               std::int64_t ref_rows) {
  std::vector<bool> keep(nodes.size(), !cost.known());
  if (!cost.known()) return keep;
  std::vector<std::size_t> order(nodes.size());
  std::iota(order.begin(), order.end(), 0);
  // By probability; among equals a parent (smaller index in its request) first, so every prefix is
  // closed under ancestors (a child's probability never exceeds its parent's).
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (nodes[a].prob != nodes[b].prob) return nodes[a].prob > nodes[b].prob;
    if (nodes[a].request != nodes[b].request) return nodes[a].request < nodes[b].request;
    return nodes[a].index < nodes[b].index;
  });
  double tokens = base_tokens;
  spent_ms = std::max(0.0, spent_ms);
  const double base_ms = cost.step_ms(ref_rows >= 0 ? ref_rows : base_rows, mean_context);
  double best = base_tokens / (spent_ms + base_ms);
  std::size_t best_k = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    tokens += nodes[order[k]].prob;
    const double extra = cost.extra_ms(base_rows, base_rows + static_cast<std::int64_t>(k) + 1, mean_context);
    const double v = tokens / (spent_ms + base_ms + penalty * extra);
    if (v > best) best = v, best_k = k + 1;
  }
  for (std::size_t k = 0; k < best_k; ++k) keep[order[k]] = true;
  return keep;
}

}  // namespace specactor::sched
