// tests/gpu/call_kind.h — how a call ended, for the host-side tests of the device
// cache's policy and errors (tests/test_cache_plan.cpp under GoogleTest,
// tests/gpu/device_errors_test.cpp in the in-repo harness): returned, or the kind of
// error it threw. No GoogleTest here.
#pragma once

#include <exception>
#include <optional>
#include <string>

#include "qvg/error.h"

namespace qvg::testing {

enum class CallKind { Ok, InvalidArgument, Unsupported, OutOfRange, Other };

inline const char* call_kind_name(CallKind k) {
  switch (k) {
    case CallKind::Ok: return "ok";
    case CallKind::InvalidArgument: return "InvalidArgument";
    case CallKind::Unsupported: return "Unsupported";
    case CallKind::OutOfRange: return "OutOfRange";
    case CallKind::Other: return "other";
  }
  return "?";
}

/// An error kind as a CallKind (nullopt: Ok; kinds the tests do not expect: Other).
inline CallKind call_kind(std::optional<ErrorKind> e) {
  if (!e) return CallKind::Ok;
  switch (*e) {
    case ErrorKind::InvalidArgument: return CallKind::InvalidArgument;
    case ErrorKind::Unsupported: return CallKind::Unsupported;
    case ErrorKind::OutOfRange: return CallKind::OutOfRange;
    default: return CallKind::Other;
  }
}

/// Calls f: Ok, or the kind of what it threw (any other exception: Other), its
/// message in *msg when given.
template <class F>
CallKind call_kind(F&& f, std::string* msg = nullptr) {
  try {
    f();
    return CallKind::Ok;
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return call_kind(std::optional<ErrorKind>(e.kind()));
  } catch (const std::exception& e) {
    if (msg) *msg = e.what();
    return CallKind::Other;
  }
}

}  // namespace qvg::testing
