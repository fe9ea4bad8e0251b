// src/cache/view_assembly.h — the assembly of a packed cache's copied view, shared
// by the CPU cache (packed_cache.cpp) and the device cache (cuda/device_cache.cpp),
// as span_execution.h shares the execution of an advance's encodings: the policy's
// plan says where each view token comes from (PackedPlan::pieces, then the call's
// own chunk); the backends differ only in how they copy rows and decode ranges.
//
// One pass per view element: raw segments are copied, every packed range (K and V
// of every span, a refined chunk's layer included) goes into one decode call, so a
// window costs one parallel region on the CPU and one launch per mode on the device.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/cache_policy.h"
#include "qvg/codec.h"

namespace qvg::detail {

/// Assembles the copied view of `plan` (plan.call.copies) over the segment list
/// `segs` (the list after the call). `be`, the backend, has:
///   DecodeTarget target(bool is_k, int64_t out_t)  where view token out_t of K / V is;
///   void copy_raw(const Seg& s, const ViewPiece& pc)  rows [pc.t0, pc.t1) of a raw
///       segment's K and V, the call's heads, to view token pc.out_t;
///   void copy_chunk()  the call's key and value rows to the view's last n tokens;
///   void decode(const std::vector<Task>& tasks)  every range, in one call.
/// Task is the backend's decode task (DecodeTask, cuda::DeviceDecodeTask): {encoding,
/// t0, t1, h0, h1, target, span codebook or null, refinement layer or null}.
/// A segment's payload has k_enc, v_enc, k_book, v_book (span codebooks, maybe
/// null, with a member `book`) and k_ref, v_ref (optional layers; held() by value or
/// shared_ptr).
template <class Task, class Seg, class Backend>
void assemble_view(const std::vector<Seg>& segs, const PackedPlan& plan, Backend& be) {
  const int64_t h0 = plan.call.call.head_start, h1 = h0 + plan.call.call.heads;
  std::vector<Task> tasks;
  tasks.reserve(2 * plan.pieces.size());
  for (const ViewPiece& pc : plan.pieces) {
    const Seg& s = segs[pc.seg];
    if (!s.packed) {
      be.copy_raw(s, pc);
      continue;
    }
    for (const bool is_k : {true, false}) {
      const auto& book = is_k ? s.data.k_book : s.data.v_book;
      const auto& ref = is_k ? s.data.k_ref : s.data.v_ref;
      tasks.push_back(Task{&held(is_k ? s.data.k_enc : s.data.v_enc), pc.t0, pc.t1, h0, h1, be.target(is_k, pc.out_t),
                           book ? &book->book : nullptr, ref ? &*ref : nullptr});
    }
  }
  be.copy_chunk();
  if (!tasks.empty()) be.decode(tasks);
}

}  // namespace qvg::detail
