// Warm start measured (qvg/eval/simulate.h, warm_start_figures(); docs/quality.md):
// each one-chunk span's first k-means stage seeded at random and from the previous
// span's centroids, compared by inertia and time.
#include <algorithm>
#include <chrono>
#include <vector>

#include "codec/kmeans.h"
#include "qvg/eval/frontier.h"
#include "qvg/eval/simulate.h"
#include "qvg/eval/workload.h"
#include "qvg/tensor.h"
#include "sim/sim_common.h"

namespace qvg {

namespace {
using clock_type = std::chrono::steady_clock;
}  // namespace

WarmStartFigures warm_start_figures(const std::string& model, double scale, int layers, int centroids, int64_t chunks,
                                    uint64_t seed, int threads) {
  WorkloadOptions wo;
  wo.scale = scale;
  wo.seed = seed;
  wo.threads = threads;
  const Workload w(find_model_preset(model), wo);
  const ModelPreset& p = w.preset();
  WarmStartFigures f;
  double inertia_r2 = 0, inertia_w2 = 0, inertia_w1 = 0, iters_sum = 0;
  int64_t reached = 0;
  GenerateParts parts;
  parts.k_pre_rope = false;
  parts.q = false;
  const int64_t ct = p.chunk_tokens(), H = p.heads, D = p.head_dim;
  for (int layer : select_layers(p.layers, layers)) {
    const LayerChunk ctx = w.generate_frames(layer, 0, chunks * p.frames_per_chunk, parts);
    for (const Tensor* x : {&ctx.k, &ctx.v}) {
      std::vector<float> all(size_t(x->shape().numel()));
      convert_to_f32(x->data(), x->dtype(), all.data(), all.size());
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> prev;  // the previous span's centroids of this head
        for (int64_t c = 0; c < chunks; ++c) {
          std::vector<float> pts(size_t(ct * D));
          for (int64_t t = 0; t < ct; ++t)
            std::copy_n(all.data() + size_t(((c * ct + t) * H + h) * D), D, pts.data() + t * D);
          detail::KMeansParams kp;
          kp.k = centroids;
          kp.seed = 1234;
          kp.b = 0;
          kp.h = h;
          kp.record_inertia = true;
          kp.iters = 2;
          const detail::KMeansResult rr = detail::kmeans(pts.data(), ct, D, kp);
          // Timed without the inertia record (an fp64 pass per iteration).
          detail::KMeansParams tp = kp;
          tp.record_inertia = false;
          auto t0 = clock_type::now();
          (void)detail::kmeans(pts.data(), ct, D, tp);
          const double rs = sim::seconds_since(t0);
          if (!prev.empty() && int64_t(prev.size()) == int64_t(centroids) * D) {
            const double target = rr.inertia.back();
            detail::KMeansParams wp = kp;
            wp.init = Init::Warm;
            wp.warm = prev.data();
            wp.iters = 8;
            const detail::KMeansResult wr = detail::kmeans(pts.data(), ct, D, wp);
            int need = -1;
            for (size_t i = 0; i < wr.inertia.size(); ++i)
              if (wr.inertia[i] <= target) {
                need = int(i);
                break;
              }
            ++f.groups;
            f.random_s += rs;
            inertia_r2 += target;
            inertia_w1 += wr.inertia[std::min<size_t>(1, wr.inertia.size() - 1)];
            inertia_w2 += wr.inertia[std::min<size_t>(2, wr.inertia.size() - 1)];
            // Warm with random's 2 iterations (equal time), timed.
            detail::KMeansParams w2 = wp;
            w2.iters = 2;
            w2.record_inertia = false;
            t0 = clock_type::now();
            (void)detail::kmeans(pts.data(), ct, D, w2);
            f.warm_s_equal_iters += sim::seconds_since(t0);
            if (need < 0) {
              ++f.warm_never;
            } else {
              f.random_s_reached += rs;
              ++reached;
              iters_sum += need;
              // Time warm k-means with the iterations it needed (0: the initial
              // centroids already do: one assignment pass).
              wp.iters = std::max(1, need);
              wp.record_inertia = false;
              t0 = clock_type::now();
              (void)detail::kmeans(pts.data(), ct, D, wp);
              f.warm_s_to_target += sim::seconds_since(t0);
            }
          }
          // The next span warm-starts from this span's centroids as the cache's chain
          // makes them (init warm, kmeans_iters 2; the first span random).
          if (prev.empty()) {
            prev = rr.centroids;
          } else {
            detail::KMeansParams wp = kp;
            wp.init = Init::Warm;
            wp.warm = prev.data();
            wp.record_inertia = false;
            prev = detail::kmeans(pts.data(), ct, D, wp).centroids;
          }
        }
      }
    }
  }
  f.warm_iters_to_target = reached > 0 ? iters_sum / double(reached) : 0;
  f.inertia_ratio_equal_iters = inertia_r2 > 0 ? inertia_w2 / inertia_r2 : 0;
  f.inertia_ratio_one_iter = inertia_r2 > 0 ? inertia_w1 / inertia_r2 : 0;
  return f;
}

}  // namespace qvg
