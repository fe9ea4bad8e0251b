// src/cache/snapshot_encoding.h — private: an encoding inside a snapshot section
// (docs/snapshot.md, "segment i"), writer and reader side by side: its layout —
// dtype, shape [B, S, H, D], bits, block_size, stages, centroids, asymmetric,
// scale_dtype, scaling — followed by the arrays of spec 1.5 a record holds (Arrays),
// their sizes implied by the layout.
#pragma once

#include <cstdint>

#include "cache/snapshot_io.h"
#include "core/bytes_impl.h"
#include "qvg/cache_options.h"
#include "qvg/codec.h"
#include "qvg/config.h"

namespace qvg::detail::snap {

/// Appends e's layout (owned) and the arrays `which` selects (borrowed from e) to s.
void put_encoded(SectionOut& s, const EncodedTensor& e, Arrays which);

/// Reads an encoding's layout and the arrays `which` selects; they must fit the rest
/// of the section before anything is allocated. Validates what it reads: a whole
/// encoding as EncodedTensor::validate() and validate_values() do; codebooks finite;
/// a span chunk's factors (its ids and values are checked against its span's
/// codebooks by check_span_chunk()). Throws CorruptData (through r) or InvalidArgument.
EncodedTensor get_encoded(ByteReader& r, Arrays which);

/// The arrays of a chunk of an incremental span against its span's codebook: every
/// id a slot in use, every element decoding finite (validate_values() with the
/// span's centroids). Throws CorruptData naming `what`.
void check_span_chunk(EncodedTensor& part, SpanCodebook& book, const char* what);

/// Throws InvalidArgument naming `what` unless l is what this cache (options o,
/// settings q) encodes for `role`, of `tokens` tokens when check_tokens.
void check_layout_fits(const EncodingLayout& l, const CacheOptions& o, const QuantArgs& q, CacheRole role,
                       bool check_tokens, int64_t tokens, const char* what);

}  // namespace qvg::detail::snap
