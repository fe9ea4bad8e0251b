// src/kernels/cuda/cuda_kernels.h — the CUDA kernel interface, mirroring
// src/kernels/kernels.h: plain functions over raw device pointers, each enqueued
// on the given stream; none synchronizes. Launch errors throw CudaError (through
// check_launch); execution errors surface at the caller's next synchronization.
//
// Layouts are those of spec 1.5 and of the CPU encoder's per-group scratch:
// a "group" is one (b, h) pair, g = b * H + h; per-group point arrays are
// [G, S, D] row-major (token rows).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/bodies.cuh"
#include "kernels/cuda/encode_bodies.cuh"
#include "kernels/cuda/guard_bodies.cuh"

namespace qvg::cuda::kernels {

// DecodeArgs: see bodies.cuh.
// ---- decode -------------------------------------------------------------------

/// Decodes the tasks (spec 1.3, bit-identical to decode_rows_reference): one launch
/// per kDecodeTasksPerLaunch tasks of one mode (plan_decode). REQUIRES every task
/// in range; targets disjoint.
void decode_tasks(const DecodeArgs* tasks, int n, cudaStream_t stream);

// ---- encode: points ---------------------------------------------------------

/// mu[g, :] = the group mean of x (dense [B, S, H, D] of dtype `dtype`; mean_of_partials:
/// fp64 sums of kMeanChunk points in point order, added in chunk order), and, with r
/// set, r[g, t, :] = x[b, t, h, :] as fp32 (the kernels that need stage 0's points in
/// the residual buffer: kmeans++; the others read x as Points). `partial`: G *
/// ceil(S / kMeanChunk) * D doubles.
/// With init.idx set, the same launch also draws stage 0's initial point indices
/// (as init_indices(B * H, H, S, init.K, init.k_eff, init.seed, 0, init.head_offset,
/// init.idx)), beside the gather: they do not depend on the data.
struct InitDraw {
  uint32_t* idx = nullptr;
  int64_t G = 0;  ///< set by gather_points (the groups whose indices its first blocks draw)
  int K = 0, k_eff = 0;
  uint64_t seed = 0;
  int64_t head_offset = 0;
};
void gather_points(const void* x, int dtype, int64_t B, int64_t S, int64_t H, int64_t D, float* r, double* partial,
                   float* mu, cudaStream_t stream, const InitDraw& init = {});
/// xb[g, t, :] = bf16(r[g, t, :] - mu[g, :]) and maxabs[g] = max |r - mu| (fp32), for
/// the G groups of r (Points: the residual buffer or the input).
/// REQUIRES maxabs zeroed.
void center_points(const Points& r, const float* mu, int64_t G, uint16_t* xb, float* maxabs, cudaStream_t stream);
/// Initial point indices idx[g * K + j], j < k_eff, as init_random of kmeans.cpp picks
/// them (random_init_indices: same PRNG stream per (seed, stage, b, h + head_offset)); 0..k_eff-1
/// in order when k_eff == S. One block per group, O(k_eff) work each.
void init_indices(int64_t G, int64_t H, int64_t S, int K, int k_eff, uint64_t seed, int stage, int64_t head_offset,
                  uint32_t* idx, cudaStream_t stream);
/// Initial point indices idx[g * K + j], j < k_eff, as init kmeans++ of kmeans.cpp picks
/// them (kmeanspp_init_indices) from the centred points r[g] - mu[g] (r: the stage's
/// Points, the input or the fp32 residual buffer, read as fp32 exactly; one rounded
/// subtraction each), with the same PRNG stream per (seed, stage, b, h + head_offset)
/// as init_indices; 0..k_eff-1 in order when k_eff == S (kmeanspp.cuh states the
/// rule and its exact pruning). k_eff - 1 rounds; each group's points split over
/// `blocks_per_group` blocks, a thread block cluster (0: chosen from G, S and the
/// device; 1, 2, 4 or 8 otherwise, more than 1 only where kmeanspp_clusters_supported),
/// kmeanspp_kernels.cu: cost. `scratch`: kmeanspp_scratch_bytes(G, S) bytes, 8-byte
/// aligned. REQUIRES 1 <= k_eff <= min(K, S), K <= 256. Throws InvalidArgument for a
/// blocks_per_group the device cannot run, a D whose shared memory it lacks.
void kmeanspp_indices(const Points& r, const float* mu, int64_t G, int64_t H, int K, int k_eff, uint64_t seed,
                      int stage, int64_t head_offset, void* scratch, uint32_t* idx, cudaStream_t stream,
                      int blocks_per_group = 0);
/// Bytes of kmeanspp_indices' scratch: 5 per point and 104 per group.
size_t kmeanspp_scratch_bytes(int64_t G, int64_t S);
/// Whether the current device runs kmeanspp_indices with several blocks per group
/// (thread block clusters: a device of compute capability 9.0 or later and the
/// kernel's code built for one). Queried once per device.
bool kmeanspp_clusters_supported();
/// Initial centred centroids: c[g, j, :] = r[g, idx[g*K + j], :] - mu[g, :] for j < k_eff,
/// zero for k_eff <= j < K.
void init_centroids(const Points& r, const float* mu, const uint32_t* idx, int64_t G, int K, int k_eff, float* c,
                    cudaStream_t stream);
/// cb = bf16(c) and cnorm[g, j] = ||cb[g, j]||^2 (fp32, fixed order) for j < k_eff,
/// +inf (never chosen) for j >= k_eff.
void prepare_centroids(const float* c, int64_t G, int64_t D, int K, int k_eff, uint16_t* cb, float* cnorm,
                       cudaStream_t stream);

// ---- encode: k-means iteration --------------------------------------------

/// Whether group g still iterates at iteration `it`: changed[j * G + g] >= stop for
/// every j < it (spec 1.1 early stop, decided on the device).
/// The largest head dim the device encoder serves on the current device: the generic
/// assignment keeps at least one fp32 centroid row (4 x D bytes) in shared memory.
int64_t max_encode_head_dim();
/// Assignment (spec 1.1 expanded form on group-centred points, argmin fused, no
/// N x K matrix): ids[g, t] = argmin_j cnorm[g, j] - 2 xb[g, t] . cb[g, j], x.c on
/// tensor cores (mma.sync bf16, fp32 accumulation) when D is 64, 128 or 256 (and
/// the device has the shared memory for the codebook), else in fp32 from the bf16
/// values. changed[it * G + g] += ids that changed (all at it == 0).
void assign(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int64_t D, int K,
            uint8_t* ids, int* changed, int it, double stop, cudaStream_t stream);
/// Centroid update: for active groups, c[g, j, :] = mean of the centred points
/// (r - mu) with id j, accumulated exactly in 64-bit fixed point (scale from
/// maxabs[g]); empty clusters keep c. `sums`: G*K*D int64, `counts`: G*K int32
/// (both zeroed here).
void update_centroids(const Points& r, const float* mu, const float* maxabs, const uint8_t* ids, int64_t G, int64_t S,
                      int64_t D, int K, long long* sums, int* counts, float* c, const int* changed, int it, double stop,
                      cudaStream_t stream);

// ---- encode: end of a stage -----------------------------------------------

/// out_c[g, j, :] = (c + mu) rounded to `dtype` (zero for j >= k_eff); stored[g, j, :]
/// = that value as fp32 (stored_centroid). Unless `last`: then r[g, t, :] = src[g, t, :]
/// - stored[g, ids[g, t], :] (src: this stage's points, r itself or the input) and mu =
/// the new residual's group mean (as gather_points; `partial` as there). The last
/// stage's subtraction is the quantizer's.
void finish_stage(const Points& src, float* r, const float* c, float* mu, const uint8_t* ids, int64_t G, int64_t S,
                  int64_t D, int K, int k_eff, int dtype, void* out_c, float* stored, bool last, double* partial,
                  cudaStream_t stream);

// ---- encode: residual quantize-and-pack (spec 1.2, 1.4) ----------------------

// QuantizeArgs: see encode_bodies.cuh.
/// Bit-identical to quantize_residual_group for the same final residual. Passes:
/// block statistics (one thread per 8 channels and a segment shuffle per block when
/// quantize_vectorizable, else one thread per block), stored scales (one thread per
/// block), pack (one thread per 8 channels, else per group of codes; one kernel
/// instantiation per code width, chosen through qvg::dispatch_width); the last stage's
/// subtraction is done in registers in the first and the last pass.
void quantize_residual(const QuantizeArgs& a, cudaStream_t stream);

// ---- scale search, incremental spans, refinement (span_kernels.cu) -----

/// ScaleSearch::Mse after quantize_residual(a): every block's stored scale (and
/// zero) and codes replaced by search_block's (bit-identical to
/// quantize_residual_group with Mse): a half-warp per block (search_half_kernel) up
/// to 767 channels per block, a thread per block beyond. REQUIRES a's arrays as
/// quantize_residual left them.
void search_scales(const QuantizeArgs& a, cudaStream_t stream);
/// c[g, j, :] = warm[g, first + j, :] - mu[g, :] for j < k (warm: a codebook of K
/// slots in `dtype`): the initial centred centroids of a warm start.
void warm_centroids(const void* warm, int dtype, int64_t K, int64_t first, int64_t k, int64_t G, int64_t D,
                    const float* mu, float* c, cudaStream_t stream);
/// book[g, first + j, :] = (c[g, j, :] + mu[g, :]) rounded to `dtype`, j < k.
void store_new_centroids(const float* c, const float* mu, int dtype, int64_t K, int64_t first, int64_t k, int64_t G,
                         int64_t D, void* book, cudaStream_t stream);
/// stored = book as fp32 and c = stored - mu ([G, K, D]).
void book_entries(const void* book, int dtype, int64_t G, int64_t K, int64_t D, const float* mu, float* stored,
                  float* c, cudaStream_t stream);
/// r[g, t, :] -= stored[g, ids[g, t], :].
void subtract_stored_centroids(float* r, const float* stored, const uint8_t* ids, int64_t G, int64_t S, int64_t K,
                               int64_t D, cudaStream_t stream);
/// ids[g, t] = nearest_slot(...): every point to the nearest of the first `used`
/// slots (any S; one thread per point).
void assign_to_slots(const uint16_t* xb, const uint16_t* cb, const float* cnorm, int64_t G, int64_t S, int64_t K,
                     int64_t D, int used, uint8_t* ids, cudaStream_t stream);
/// mu[g, d] = group_mean(r, ...).
void group_means(const float* r, int64_t G, int64_t S, int64_t D, float* mu, cudaStream_t stream);
/// out[g] = group_energy(a, g): G doubles, by G x energy_blocks(S) blocks (exact
/// integer sums: the same bits). scratch: 2 * G words, overwritten.
void residual_energies(const QuantizeArgs& a, unsigned long long* scratch, double* out, cudaStream_t stream);
/// out[i] = refinement_error(x, decoded, dtype, lim, i), i < n.
void refinement_errors(const void* x, const void* decoded, int dtype, float lim, int64_t n, float* out,
                       cudaStream_t stream);
/// refine_one over every element of each task's range (one launch per task).
void refine_tasks(const DecodeArgs* tasks, int n, cudaStream_t stream);

/// Index of the first element of x (n elements of `dtype`) that is not finite or has
/// |x| > 1e16, written to *first_bad by atomicMin (initialised by the caller to n or more).
void first_out_of_limit(const void* x, int dtype, int64_t n, unsigned long long* first_bad, cudaStream_t stream);

// ---- the deferred input check of the device caches (guard_kernels.cu) -----
// CheckFlags, CheckSlot: see guard_bodies.cuh. The flags' first[] are set to ~0 by the
// caller (a memset of 0xFF), lowered by first_out_of_limit over key and value.

/// One thread: when the call's flags show a bad element, numbers the call
/// (++flags->bad_calls) and writes bad_call_slot(...) into slots[call % kCheckSlots]
/// (pinned host memory mapped into the device), its number last.
void publish_check(CheckFlags* flags, const void* key, const void* value, int dtype, int64_t B, int64_t n, int64_t H,
                   int64_t D, int64_t chunk_start, CheckSlot* slots, cudaStream_t stream);
/// The rows of cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows) copied when
/// input_ok(*flags, n_key, n_value); else zeros written (zero_if_bad) or nothing.
void guarded_copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                    const CheckFlags* flags, uint64_t n_key, uint64_t n_value, bool zero_if_bad, cudaStream_t stream);

/// Benchmark data: x[b, t, h, d] (dense [B, S, H, D], bf16/f16/f32) = a clustered,
/// per-head-offset pattern plus noise, from a counter-based hash of (seed, index):
/// K/V-like structure without a host round trip. Scale about `scale`.
void fill_clustered(void* x, int dtype, int64_t B, int64_t S, int64_t H, int64_t D, uint64_t seed, float scale,
                    cudaStream_t stream);

}  // namespace qvg::cuda::kernels
