// The faiss k-means peer for the benchmarks (built only when faiss is found;
// faiss is a comparison, never a dependency of the library).
#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>
#include <omp.h>

#include <algorithm>

#include "perf/perf.h"

namespace qvg::perf {

PeerKMeans faiss_kmeans() {
  return [](const float* x, int64_t groups, int64_t n, int64_t d, int k, int iters, int threads, uint64_t seed,
            float* centroids) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);  // faiss and OpenBLAS (openmp build) use OpenMP threads
    for (int64_t g = 0; g < groups; ++g) {
      faiss::ClusteringParameters cp;
      cp.niter = iters;
      cp.seed = int(seed);
      cp.verbose = false;
      cp.max_points_per_centroid = 1 << 30;  // never subsample
      cp.min_points_per_centroid = 1;
      faiss::Clustering clus(int(d), k, cp);
      faiss::IndexFlatL2 index(d);
      clus.train(faiss::Index::idx_t(n), x + g * n * d, index);
      std::copy(clus.centroids.begin(), clus.centroids.end(), centroids + g * k * d);
    }
    omp_set_num_threads(saved);
    return true;
  };
}

}  // namespace qvg::perf
