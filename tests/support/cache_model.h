// Independent models of the caches for the randomized differential tests
// (the pattern of LevelDB's ModelDB): each model restates its spec section as
// literally as possible, token by token, with none of the library's code.
//
//   DenseModel   — spec 3.2: a buffer of token slots, cursors, rolls, growth.
//   PackedModel  — spec 4 policy: per-chunk records (raw / packed in span k /
//                  dropped), the visible window formula, expected resident bytes.
//   KVHistory    — every K/V value written, by global position (what the packed
//                  cache must show for a position).
// Plus random call sequences and the codec error bound of spec 1.2.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "qvg/cache.h"
#include "qvg/codec.h"
#include "qvg/config.h"
#include "qvg/error.h"
#include "qvg/tensor.h"
#include "support/data.h"

namespace qvg::testing {

/// Iteration counts shrink when QVG_TEST_SCALE=small (sanitizer builds).
bool small_scale();
/// `full` normally, `small` under QVG_TEST_SCALE=small.
int scaled(int full, int small);

/// One update() call.
struct Call {
  int64_t c = 0;
  std::optional<int64_t> hs;  ///< cache_head_start as passed
  std::optional<int64_t> rw;  ///< recent_window_tokens as passed
  Tensor k, v;                ///< [B, n, h_in, D]
  int64_t n() const { return k.shape().s; }
  int64_t h_in() const { return k.shape().h; }
  int64_t head0() const { return hs.value_or(0); }
};

/// What a model predicts for one call's view: [B, T, h_in, D] as fp32.
struct ModelView {
  Shape4 shape;
  std::vector<float> k, v;
  int64_t local_start = 0, local_end = 0, visible_local_end = 0, visible_global_end = 0;
};

/// Spec 3.2, restated. Same error order as documented in qvg/cache.h.
class DenseModel {
 public:
  explicit DenseModel(const CacheOptions& o);
  /// The error kind the call must raise, or nullopt if valid. Assumes the
  /// call's shapes/dtypes/heads are valid (those errors are tested separately).
  std::optional<ErrorKind> check(const Call& call) const;
  /// REQUIRES check(call) == nullopt.
  ModelView apply(const Call& call);
  void reset() { ge_ = le_ = 0; }
  int64_t global_end() const { return ge_; }
  int64_t local_end() const { return le_; }
  int64_t cache_size() const { return cap_; }
  int64_t window() const { return window_; }
  size_t resident_nbytes() const;

 private:
  CacheOptions o_;
  int64_t cap_, window_, ge_ = 0, le_ = 0;
  // slots_[i] = K of buffer index i as [b][h][d]; same for V.
  std::vector<std::vector<float>> kslots_, vslots_;
};

/// All values written, by global position: [b][h][d] per position; positions
/// and heads never written read as 0 (a new packed chunk is zero-filled).
class KVHistory {
 public:
  KVHistory(int64_t B, int64_t H, int64_t D) : B_(B), H_(H), D_(D) {}
  void write(const Call& call);
  float k(int64_t g, int64_t b, int64_t h, int64_t d) const { return get(k_, g, b, h, d); }
  float v(int64_t g, int64_t b, int64_t h, int64_t d) const { return get(v_, g, b, h, d); }
  void clear() {
    k_.clear();
    v_.clear();
  }
  /// View of positions `pos` (in order) for heads [hs, hs + h): [B, T, h, D].
  ModelView view(const std::vector<int64_t>& pos, int64_t hs, int64_t h) const;

 private:
  float get(const std::map<int64_t, std::vector<float>>& m, int64_t g, int64_t b, int64_t h, int64_t d) const;
  int64_t B_, H_, D_;
  std::map<int64_t, std::vector<float>> k_, v_;
};

/// Spec 4 policy, restated per chunk.
class PackedModel {
 public:
  PackedModel(const CacheOptions& o, const QuantArgs& q);
  std::optional<ErrorKind> check(const Call& call) const;
  struct Result {
    std::vector<int64_t> positions;  ///< global positions shown, in order
    int64_t local_start = 0, local_end = 0, visible_local_end = 0, visible_global_end = 0;
  };
  /// REQUIRES check(call) == nullopt.
  Result apply(const Call& call);
  void reset();

  /// The segments the cache must hold: alive chunks, merged per span (a span encoded
  /// whole); the chunks of an incremental span stay separate segments, and
  /// `joins_prev` says that one shares the span (codebook) of the segment before it.
  struct Seg {
    int64_t g0 = 0, g1 = 0;
    bool sink = false, packed = false;
    int chunks = 1;
    bool joins_prev = false;
    bool refined = false;  ///< holds refinement layers: one of the refine_recent newest incremental chunks
    bool operator==(const Seg&) const = default;
  };
  /// Incremental spans: decides, for every incremental chunk in encoding order,
  /// whether it joins the open span when it may (the cache's adaptive boundary is
  /// data-dependent; tests feed its decisions back). Default: always.
  void set_join_decision(std::function<bool()> join) { join_ = std::move(join); }
  std::vector<Seg> segments() const;
  /// Raw bytes + predicted encoded bytes of segments() (spec 4 resident_nbytes).
  size_t expected_resident(DType dt) const;
  int64_t global_end() const { return ge_; }
  int encodings() const { return next_span_; }  ///< spans started since construction/reset

 private:
  enum class St { Raw, Packed, Dropped };
  struct Chunk {
    int64_t g0, g1;
    bool sink;
    St st = St::Raw;
    int span = -1;
    bool incremental = false;  ///< a chunk of an incremental span (encoded and evicted on its own)
  };
  void pack_and_evict();
  CacheOptions o_;
  QuantArgs q_;
  int64_t ge_ = 0;
  std::vector<Chunk> chunks_;  // every chunk ever advanced since reset, in order
  int next_span_ = 0;
  int open_span_ = -1, open_chunks_ = 0;  // the incremental span chunks may join
  std::function<bool()> join_;
};

/// Compares a cache view with a model view exactly (bit patterns of fp32
/// values). Returns "" when equal, else a description of the first difference.
std::string compare_exact(const KVView& got, const ModelView& want);
/// Compares two cache views exactly (shape and values).
std::string compare_views(const KVView& a, const KVView& b);

/// Spec 1.2 bound for element (b, s, h, :) of `e`: x = original row (fp32,
/// D values), got = decoded row as shown (fp32 of the output dtype). Returns
/// "" when every channel satisfies
///   |x - got| <= s_eff/2 + dist(r, range) + ulp_out(got) + 1e-5 * (|x| + sum |c| + |r|)
/// with r the exact residual from the stored centroids.
std::string check_bound(const EncodedTensor& e, int64_t b, int64_t s, int64_t h, const float* x, const float* got,
                        DType out);

/// Checks a packed cache view against the history: raw parts bit-identical,
/// encoded parts within the bound. Positions as predicted by PackedModel.
std::string check_packed_view(const PackedCausalCache& cache, const KVView& view,
                              const std::vector<int64_t>& positions, const KVHistory& hist, int64_t hs);

/// Compares the cache's segments with the model's; "" when equal.
std::string compare_segments(const PackedCausalCache& cache, const std::vector<PackedModel::Seg>& want);

/// Runs `call` on a cache; returns the error kind thrown, if any.
struct Outcome {
  std::optional<ErrorKind> error;
  std::string message;
  KVView view;
};
Outcome run_call(CausalCache& cache, const Call& call);

/// Random call sequences valid-ish for both caches: sequential chunks of
/// varying size, 1-4 denoising steps each, head-sliced steps writing every head.
struct ScenarioParams {
  int64_t B = 1, H = 1, D = 8;
  DType dtype = DType::F32;
  int64_t base_chunk = 4;  ///< typical chunk size
  bool vary_chunks = true;
  float slice_prob = 0.3f;  ///< probability that a step is written head-sliced
  float rw_prob = 0.5f;     ///< probability that a call passes recent_window_tokens
  int steps_max = 4;
};
/// The calls of one chunk [c, c + n): steps x (1 call or one per head group).
std::vector<Call> chunk_calls(std::mt19937_64& rng, const ScenarioParams& p, int64_t c, int64_t n);
/// A random valid quantization configuration for head_dim D (small codebooks, 1-2
/// stages, every policy option, threads = 1).
QuantArgs random_quant(std::mt19937_64& rng, int bits, int64_t D);
/// A random recent_window_tokens choice (absent / 0 / positive).
std::optional<int64_t> random_rw(std::mt19937_64& rng, const ScenarioParams& p);

}  // namespace qvg::testing
