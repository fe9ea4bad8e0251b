// GPU tests of the device encoder's init kmeans++ (part of qvg_gpu_tests; need a
// CUDA device):
// - kmeanspp_indices (kmeanspp_kernel) makes exactly the CPU codec's picks
//   (qvg::detail::kmeanspp_init_indices) from the device's own centred points
//   (r - mu, downloaded after gather_points), at stage 0 and with another stage's
//   stream, with a head_offset, with duplicated points (the total-0 branch) and
//   k_eff == S; with the kernel's own split of a group over blocks, one block per
//   group, clusters of 2, 4 and 8 blocks (where the device has clusters), and from the
//   input's own rows (bf16 / fp32) as a stage-0 encode reads them;
// - a device encode with init kmeans++ is deterministic and byte for byte the host
//   replay of its own assignments (tests/gpu/encode_replay.h replays the picks with
//   kmeanspp_picks_host, the kernel's bodies on the host), every stage.
// The host test of the bodies against the CPU rule is tests/gpu/host_kmeanspp_test.cpp;
// the device packed cache with kmeans++ (incremental spans: span chunks seed their
// new centroids with kmeans++ too) is run in tests/gpu/all_settings_tests.cpp.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/cuda/encode_traced.h"
#include "gpu/device_support.h"
#include "gpu/encode_replay.h"
#include "gpu/harness.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host.h"
#include "qvg/codec.h"
#include "qvg/cuda.h"
#include "qvg/error.h"

namespace {

using qvg::cuda::DeviceBuffer;
using qvg::testing::gpu::TestStream;
using qvg::testing::gpu::to_device;
using qvg::testing::gpu::to_host;
namespace A = qvg::cuda_arith;
namespace KB = qvg::cuda::kernels;

/// Clustered data with per-group offsets and scales; with distinct > 0, every token
/// of a group is a copy of one of `distinct` rows (duplicated points).
qvg::Tensor make_data(qvg::DType dtype, qvg::Shape4 sh, uint32_t seed, int distinct = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  qvg::Tensor t(dtype, sh);
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t h = 0; h < sh.h; ++h) {
      const int64_t g = b * sh.h + h;
      const float scale = g % 3 == 2 ? 300.0f : 1.0f;
      const int nc = distinct > 0 ? distinct : 24;
      std::vector<float> centers(static_cast<size_t>(nc * sh.d));
      for (float& c : centers) c = n01(rng) * scale + (g % 2 ? 2.0f * scale : 0.0f);
      for (int64_t s = 0; s < sh.s; ++s) {
        const int k = int(rng() % uint32_t(nc));
        for (int64_t d = 0; d < sh.d; ++d)
          t.set(b, s, h, d, centers[size_t(k * sh.d + d)] + (distinct > 0 ? 0.0f : 0.25f * scale * n01(rng)));
      }
    }
  return t;
}

}  // namespace

// The device's picks (kmeanspp_indices on the points and mean gather_points made)
// against the CPU rule on the same centred points.
QVG_TEST(gpu_kmeanspp_picks_equal_the_cpu_rule_on_the_device_points) {
  TestStream st;
  struct Case {
    qvg::Shape4 sh;
    int K;
    int distinct;
    int64_t head_offset;
  };
  const std::vector<Case> cases = {
      {{1, 4680, 3, 128}, 256, 0, 0},  // Self-Forcing's chunk length and head dim
      {{2, 1000, 2, 64}, 64, 0, 5},    // several batches, a shard's head offset
      {{1, 300, 2, 64}, 64, 12, 0},    // 12 distinct points: the total-0 branch
      {{1, 100, 2, 64}, 256, 0, 0},    // k_eff == S
      {{1, 700, 2, 44}, 32, 0, 1},     // D not a multiple of 8: the lanes' tails
  };
  int compared = 0, splits_run = 0;
  uint32_t seed = 700;
  for (const Case& c : cases)
    for (const qvg::DType in : {qvg::DType::BF16, qvg::DType::F32})
      for (const int stage : {0, 1}) {
        const qvg::Tensor x = make_data(in, c.sh, seed++, c.distinct);
        const int64_t B = c.sh.b, S = c.sh.s, H = c.sh.h, D = c.sh.d, G = B * H;
        const int k_eff = int(std::min<int64_t>(c.K, S));
        const int64_t nchunk = (S + KB::kMeanChunk - 1) / KB::kMeanChunk;
        DeviceBuffer dx = to_device(x.data(), x.nbytes(), st.s);
        DeviceBuffer r(size_t(G * S * D) * 4, st.s), partial(size_t(G * nchunk * D) * 8, st.s),
            mu(size_t(G * D) * 4, st.s), scratch(KB::kmeanspp_scratch_bytes(G, S), st.s),
            idx(size_t(G * c.K) * 4, st.s);
        auto* rp = static_cast<float*>(r.data());
        auto* mp = static_cast<float*>(mu.data());
        KB::gather_points(dx.data(), qvg::cuda::arith_dtype(in), B, S, H, D, rp, static_cast<double*>(partial.data()),
                          mp, st.s);
        const std::vector<float> hr = to_host<float>(rp, size_t(G * S * D), st.s);
        const std::vector<float> hmu = to_host<float>(mp, size_t(G * D), st.s);
        std::vector<std::vector<uint32_t>> cpu(static_cast<size_t>(G));  // the CPU rule's picks per group
        for (int64_t g = 0; g < G; ++g) {
          std::vector<float> xc(static_cast<size_t>(S * D));
          for (int64_t e = 0; e < S * D; ++e)
            xc[size_t(e)] = A::sub_rn(hr[size_t(g * S * D + e)], hmu[size_t(g * D + e % D)]);
          cpu[size_t(g)] =
              qvg::detail::kmeanspp_init_indices(99, stage, g / H, g % H + c.head_offset, xc.data(), S, D, k_eff);
        }
        // The kernel's choice of blocks per group, then one block, and clusters of 2,
        // 4 and 8 where the device has them (one split's picks are every split's); the
        // points read from the fp32 residual buffer, and (the chosen split) from the
        // input itself, as a stage-0 encode reads them.
        std::vector<int> splits = {0, 1};
        if (KB::kmeanspp_clusters_supported())
          for (const int n : {2, 4, 8}) splits.push_back(n);
        splits.push_back(-1);  // the input's points, the chosen split
        for (const int split : splits) {
          QVG_CUDA(cudaMemsetAsync(idx.data(), 0xFF, size_t(G * c.K) * 4, st.s));
          const KB::Points pts = split < 0 ? KB::input_points(dx.data(), qvg::cuda::arith_dtype(in), H, S, D)
                                           : KB::residual_points(rp, S, D);
          KB::kmeanspp_indices(pts, mp, G, H, c.K, k_eff, 99, stage, c.head_offset, scratch.data(),
                               static_cast<uint32_t*>(idx.data()), st.s, split < 0 ? 0 : split);
          const std::vector<uint32_t> hidx = to_host<uint32_t>(idx.data(), size_t(G * c.K), st.s);
          ++splits_run;
          for (int64_t g = 0; g < G; ++g) {
            const std::vector<uint32_t>& want = cpu[size_t(g)];
            const bool same = std::equal(want.begin(), want.end(), hidx.begin() + g * c.K);
            QVG_EXPECT(same) << "shape" << c.sh.str() << "K" << c.K << "in" << qvg::dtype_name(in) << "stage" << stage
                             << "group" << g << "blocks per group" << split
                             << "device picks differ from the CPU rule's";
            ++compared;
          }
        }
      }
  const int per_split = 2 * 2 * (3 + 4 + 2 + 2 + 2);
  std::printf("  %d groups' picks compared (%d launches; clusters %s)\n", compared, splits_run,
              KB::kmeanspp_clusters_supported() ? "2, 4, 8 and the chosen split; the input's points too"
                                                : "not supported: one block per group; the input's points too");
  QVG_EXPECT(compared == per_split * (KB::kmeanspp_clusters_supported() ? 6 : 3)) << compared;
}

// A device encode with init kmeans++: deterministic, and the host replay of its own
// assignments byte for byte (the picks, every stage's, included).
QVG_TEST(gpu_kmeanspp_encode_equals_host_replay_of_its_assignments) {
  TestStream st;
  struct Case {
    qvg::Shape4 sh;
    int K, bits, stages;
    bool asym;
    int distinct;
    int64_t head_offset;
  };
  const std::vector<Case> cases = {
      {{1, 4096, 4, 128}, 256, 2, 1, false, 0, 0}, {{1, 4096, 4, 128}, 128, 4, 2, true, 0, 0},
      {{2, 1000, 2, 64}, 64, 2, 2, false, 0, 5},   {{1, 600, 2, 48}, 32, 2, 1, false, 0, 0},  // generic assign
      {{1, 100, 2, 64}, 256, 2, 1, false, 0, 0},                                              // S < K
      {{1, 500, 2, 64}, 64, 4, 2, true, 10, 0},                                               // duplicated points
  };
  uint32_t seed = 800;
  int compared = 0;
  for (const Case& c : cases)
    for (const qvg::DType in : {qvg::DType::BF16, qvg::DType::F32}) {
      qvg::CodecConfig cfg;
      cfg.bits = c.bits;
      cfg.stages = c.stages;
      cfg.asymmetric = c.asym;
      cfg.centroids = c.K;
      cfg.block_size = c.sh.d >= 64 ? 64 : 16;
      cfg.init = qvg::Init::KMeansPlusPlus;
      cfg.head_offset = c.head_offset;
      const qvg::Tensor x = make_data(in, c.sh, seed++, c.distinct);
      DeviceBuffer dx = to_device(x.data(), x.nbytes(), st.s);
      const qvg::ConstTensorView xv{dx.data(), in, c.sh};
      const size_t trace_bytes = size_t(cfg.stages * cfg.kmeans_iters) * size_t(c.sh.b * c.sh.h * c.sh.s);
      DeviceBuffer dtrace(trace_bytes, st.s);
      const qvg::EncodedTensor gpu =
          qvg::cuda::detail::encode_traced(xv, cfg, st.s, qvg::cuda::default_allocator(), dtrace.data()).download(st.s);
      const std::vector<uint8_t> trace = to_host<uint8_t>(dtrace.data(), trace_bytes, st.s);
      const qvg::EncodedTensor gpu2 = qvg::cuda::encode(xv, cfg, st.s).download(st.s);
      try {
        gpu.validate();
      } catch (const qvg::Error& err) {
        QVG_EXPECT(false) << "invalid GPU encoding:" << err.what();
        continue;
      }
      QVG_EXPECT(gpu == gpu2) << "shape" << c.sh.str() << "GPU kmeans++ encode is not deterministic";
      qvg::testing::AssignmentAgreement agree;
      const std::string diff = qvg::testing::check_against_replay(x, cfg, gpu, trace, nullptr, &agree);
      QVG_EXPECT(diff.empty()) << "shape" << c.sh.str() << "in" << qvg::dtype_name(in)
                               << "differs from the host replay of its assignments in:" << diff;
      QVG_EXPECT(agree.within_spec()) << "shape" << c.sh.str() << "in" << qvg::dtype_name(in)
                                      << "assignments outside spec 1.1's agreement:" << agree.describe();
      ++compared;
      std::printf("  kmeans++ shape=%s K=%d in=%s: replay %s; assignments: %s\n", c.sh.str().c_str(), c.K,
                  std::string(qvg::dtype_name(in)).c_str(), diff.empty() ? "equal" : "DIFFERS",
                  agree.describe().c_str());
    }
  QVG_EXPECT(compared == 12) << compared;
}
