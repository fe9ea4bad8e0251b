// An encoding inside a snapshot section (snapshot_encoding.h): writer and reader side
// by side, and the checks of what a reader reads against the cache's settings.
#include "cache/snapshot_encoding.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "qvg/error.h"

namespace qvg::detail::snap {

namespace {

bool holds(Arrays which, const ArrayDesc& a) {
  const bool c = a.kind == EncodedArray::Centroids;
  return which == Arrays::All || (which == Arrays::CodebooksOnly) == c;
}

// ---- the layout: writer and reader ---------------------------------------------------
void put_layout(ByteWriter& w, const EncodingLayout& l) {
  w.put_str(dtype_name(l.dtype));
  for (int64_t d : {l.shape.b, l.shape.s, l.shape.h, l.shape.d}) w.put(d);
  for (int v : {l.bits, l.block_size, l.stages, l.centroids}) w.put(static_cast<int32_t>(v));
  w.put_bool(l.asymmetric);
  w.put_str(name(l.scale_dtype));
  w.put_str(name(l.scaling));
}

EncodingLayout get_layout(ByteReader& r) {
  EncodingLayout l;
  l.dtype = parse_dtype(r.get_str("dtype", kMaxKey), "encoding dtype");
  l.shape.b = r.get<int64_t>("shape");
  l.shape.s = r.get<int64_t>("shape");
  l.shape.h = r.get<int64_t>("shape");
  l.shape.d = r.get<int64_t>("shape");
  l.bits = r.get<int32_t>("bits");
  l.block_size = r.get<int32_t>("block_size");
  l.stages = r.get<int32_t>("stages");
  l.centroids = r.get<int32_t>("centroids");
  l.asymmetric = r.get_bool("asymmetric");
  l.scale_dtype = parse_scale_dtype(r.get_str("scale_dtype", kMaxKey));
  l.scaling = parse_scaling(r.get_str("scaling", kMaxKey));
  l.check();  // ranges: every size below is then computed without overflow
  return l;
}

}  // namespace

// ---- the encoding: writer and reader -------------------------------------------------
void put_encoded(SectionOut& s, const EncodedTensor& e, Arrays which) {
  ByteWriter w;
  // Room for the layout up front: fewer reallocations, and GCC 12 at -O3 (the pip
  // build) no longer sees a false -Wstringop-overflow in the inlined first insert.
  w.bytes().reserve(128);
  put_layout(w, e);
  s.own(std::move(w.bytes()));
  for (const ArrayDesc& a : e.arrays())
    if (holds(which, a)) s.ref(e.array(a));
}

EncodedTensor get_encoded(ByteReader& r, Arrays which) {
  const EncodingLayout l = get_layout(r);
  std::vector<ArrayDesc> arrays = l.arrays();
  std::erase_if(arrays, [&](const ArrayDesc& a) { return !holds(which, a); });
  uint64_t need = 0;
  for (const ArrayDesc& a : arrays) need += a.bytes();
  if (need > r.remaining())
    r.fail(fmt::format("truncated: the arrays of a {} encoding need {} bytes, {} left", l.shape.str(), need,
                       r.remaining()));
  EncodedTensor e;
  if (which == Arrays::All) {
    e = EncodedTensor::allocate(l);
  } else {  // only the arrays read (every allocation bounded by the section)
    static_cast<EncodingLayout&>(e) = l;
    e.centroid.resize(size_t(l.stages));
    if (which == Arrays::WithoutCodebooks) e.ids.resize(size_t(l.stages));
  }
  for (const ArrayDesc& a : arrays) {
    const auto b = r.get_bytes(a.bytes(), "array");
    std::vector<uint8_t>* v = nullptr;
    switch (a.kind) {
      case EncodedArray::Centroids: v = &e.centroid[size_t(a.stage)]; break;
      case EncodedArray::Ids: v = &e.ids[size_t(a.stage)]; break;
      case EncodedArray::Codes: v = &e.codes; break;
      case EncodedArray::Scales: v = &e.scales; break;
      case EncodedArray::Zeros: v = &e.zeros; break;
      case EncodedArray::ScaleFactor: e.scale_factor.resize(b.size() / sizeof(float)); break;
      case EncodedArray::ZeroFactor: e.zero_factor.resize(b.size() / sizeof(float)); break;
    }
    if (v && which != Arrays::All) v->resize(b.size());
    std::span<uint8_t> dst = e.array(a);
    if (!b.empty()) std::memcpy(dst.data(), b.data(), b.size());
  }
  switch (which) {
    case Arrays::All:
      e.validate();
      e.validate_values();
      break;
    case Arrays::CodebooksOnly:
      for (const auto& c : e.centroid)
        for (size_t i = 0; i < c.size() / dtype_size(l.dtype); ++i)
          if (!std::isfinite(load_f32(c.data(), l.dtype, i)))
            r.fail(fmt::format("a centroid of a codebook is not finite (element {})", i));
      break;
    case Arrays::WithoutCodebooks:
      for (const std::vector<float>* fv : {&e.scale_factor, &e.zero_factor})
        for (float f : *fv)
          if (!(std::isfinite(f) && f > 0))
            r.fail(fmt::format("{} must be finite and > 0, got {}",
                               fv == &e.scale_factor ? "scale_factor" : "zero_factor", f));
      break;
  }
  return e;
}

// ---- checks against the cache ---------------------------------------------------------
void check_span_chunk(EncodedTensor& part, SpanCodebook& book, const char* what) {
  for (size_t st = 0; st < part.ids.size(); ++st)
    for (uint8_t id : part.ids[st])
      if (int(id) >= book.filled)
        throw CorruptData(
            fmt::format("{}: ids.{} holds id {}, its span's codebook has {} slots in use", what, st, id, book.filled));
  std::swap(part.centroid, book.book.centroid);
  try {
    part.validate_values();
  } catch (...) {
    std::swap(part.centroid, book.book.centroid);
    throw;
  }
  std::swap(part.centroid, book.book.centroid);
}

void check_layout_fits(const EncodingLayout& l, const CacheOptions& o, const QuantArgs& q, CacheRole role,
                       bool check_tokens, int64_t tokens, const char* what) {
  const CodecConfig c = q.codec_for(role);
  const bool ok = l.dtype == o.dtype && l.shape.b == o.batch && l.shape.h == o.heads && l.shape.d == o.head_dim &&
                  (!check_tokens || l.shape.s == tokens) && l.bits == c.bits && l.block_size == c.block_size &&
                  l.stages == c.stages && l.centroids == c.centroids && l.asymmetric == c.asymmetric &&
                  l.scale_dtype == c.scale_dtype && l.scaling == c.scaling;
  if (!ok)
    throw InvalidArgument(fmt::format(
        "{} is a {} {} encoding (bits={} block_size={} stages={} centroids={} asymmetric={} scale_dtype={} "
        "scaling={}); this cache encodes [{}, {}, {}, {}] {} with {}",
        what, l.shape.str(), dtype_name(l.dtype), l.bits, l.block_size, l.stages, l.centroids, l.asymmetric,
        name(l.scale_dtype), name(l.scaling), o.batch, check_tokens ? std::to_string(tokens) : std::string("S"),
        o.heads, o.head_dim, dtype_name(o.dtype), c.describe()));
}

}  // namespace qvg::detail::snap
