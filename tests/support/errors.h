// tests/support/errors.h — GoogleTest helpers for calls that must fail with a kind of
// qvg::Error.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "qvg/error.h"

namespace qvg::testing {

/// "InvalidArgument", "Unsupported", "OutOfRange", "CorruptData" or "Device".
std::string kind_name(ErrorKind k);

/// Calls f and returns the message of the qvg::Error it throws; a failure of the
/// current test when it throws another kind than `want` (the message is still
/// returned) or nothing (returns "").
template <class F>
std::string error_of(F&& f, ErrorKind want) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(kind_name(e.kind()), kind_name(want)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

}  // namespace qvg::testing
