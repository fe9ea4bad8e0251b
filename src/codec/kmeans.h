// src/codec/kmeans.h — k-means of one (b, h) group (spec 1.1). Internal: tests use it
// to check monotone inertia and agreement between the reference and fast paths.
#pragma once

#include <cstdint>
#include <vector>

#include "qvg/config.h"

namespace qvg::detail {

/// How assignment distances are computed.
enum class AssignPath {
  Reference,  ///< difference form sum((x-c)^2) in fp32; exact tie rule (lowest index)
  Fast,       ///< expanded ||c||^2 - 2 x.c on group-centred data (spec 1.1 allows it)
};

struct KMeansParams {
  int k = 128;            ///< requested codebook size (1..256)
  int iters = 2;          ///< maximum Lloyd iterations
  Init init = Init::Random;
  uint64_t seed = 1234;
  int stage = 0;          ///< with (b, h): selects the PRNG stream
  int64_t b = 0, h = 0;   ///< h: the stream's head (CodecConfig::head_offset included)
  const float* warm = nullptr;  ///< k x dim centroids (original coordinates) when init == Warm
  AssignPath path = AssignPath::Fast;
  bool record_inertia = false;  ///< fill KMeansResult::inertia (costs one fp64 pass per iteration)
  /// Threads for the assignment step (split over blocks of points; each point's id
  /// does not depend on the split, so results are the same for any count). Used
  /// when there are fewer groups than threads.
  int threads = 1;
};

struct KMeansResult {
  int k_eff = 0;                 ///< min(k, n): centroids that ids may refer to
  std::vector<float> centroids;  ///< k x dim, original coordinates, fp32 (unused rows zero)
  std::vector<uint8_t> ids;      ///< n ids of the last assignment, each < k_eff
  int iterations = 0;            ///< Lloyd iterations run
  /// inertia[0] of the initial centroids, inertia[i] after iteration i (fp64, spec 1.1).
  std::vector<double> inertia;
  /// The workspace holds these points' centring (ws.mu, ws.xc) after the call (see
  /// assign_to's `centred`); false when one centroid was computed without it.
  bool centred = true;
};

/// Scratch memory reused across the groups one thread encodes (avoids page faults
/// and zero-fills of fresh allocations per group). Contents are unspecified.
struct KMeansWorkspace {
  std::vector<float> xc, c, mu;
  std::vector<double> mean, sum, d2;
  std::vector<int64_t> cnt;
  std::vector<uint32_t> idx;
  std::vector<char> chosen;
  std::vector<uint8_t> near;  // kmeans++: each point's nearest pick so far
  std::vector<float> cc;      // kmeans++: the earlier picks' distances to the new one
  std::vector<int64_t> todo;  // kmeans++: the points measured in a round
};

/// The point indices init random picks for k centroids among n > k points of group
/// (b, h) of stage `stage` (the first k entries of a partial Fisher-Yates with the
/// PRNG stream of (seed, stage, b, h)): what kmeans() uses. The CUDA encoder draws
/// the same indices (kernels/cuda/encode_bodies.cuh); its host test compares them.
/// REQUIRES 1 <= k <= n.
std::vector<uint32_t> random_init_indices(uint64_t seed, int stage, int64_t b, int64_t h, int64_t n, int k);

/// The squared distance of two n-vectors that init kmeans++ and the reference
/// assignment use: fp32, 8 lanes (lane l adds the elements i = l (mod 8) in
/// increasing i), combined as ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
float kmeans_sqdist(const float* a, const float* b, int64_t n);

/// The point indices init kmeans++ picks for k centroids among the n group-centred
/// points xc (n x dim, xc = points - group mean, fp32) of group (b, h) of stage
/// `stage`, with the PRNG stream of (seed, stage, b, h): what kmeans() starts from
/// (its centroids are those rows of xc). k == n: 0..n-1 in order (kmeans() then
/// takes every point as its own centroid, without seeding). The CUDA encoder makes
/// the same picks from its own centred points (kernels/cuda/kmeanspp.cuh); its host
/// test and the GPU tests compare them. REQUIRES 1 <= k <= n.
std::vector<uint32_t> kmeanspp_init_indices(uint64_t seed, int stage, int64_t b, int64_t h, const float* xc, int64_t n,
                                            int64_t dim, int k);

/// Assigns each of n points (n x dim, original coordinates) to the nearest of the
/// first k of `centroids` (k x dim, original coordinates, fp32) with the same
/// distances as kmeans() (group-centred, `path`); writes ids[0..n). No update.
/// `centred`: ws already holds these points' centring (ws.mu, ws.xc), as the last
/// kmeans() of the same points left it — not computed again.
/// REQUIRES n >= 1, 1 <= k <= 256.
void assign_to(const float* points, int64_t n, int64_t dim, const float* centroids, int k, uint8_t* ids,
               AssignPath path, int threads, KMeansWorkspace& ws, bool centred = false);

/// Clusters n points of dimension dim (row-major n x dim, fp32). REQUIRES n >= 1,
/// 1 <= k <= 256, iters >= 1, warm non-null when init == Warm.
KMeansResult kmeans(const float* points, int64_t n, int64_t dim, const KMeansParams& p);
KMeansResult kmeans(const float* points, int64_t n, int64_t dim, const KMeansParams& p, KMeansWorkspace& ws);

}  // namespace qvg::detail
