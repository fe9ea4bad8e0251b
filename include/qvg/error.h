// qvg/error.h — the typed errors of spec section 5.
//
// Every failing public call throws one of these; the message names the argument,
// the value received and what is allowed. A call that throws leaves every piece
// of state (caches, encoded tensors, files) exactly as it was before the call.
// Internal invariant violations are not errors: they abort via QVG_CHECK.
#pragma once

#include <stdexcept>
#include <string>

namespace qvg {

/// The error kinds of spec section 5 (Python: ValueError, NotImplementedError,
/// RuntimeError, ValueError, RuntimeError). Persisted nowhere; order is free.
enum class ErrorKind { InvalidArgument, Unsupported, OutOfRange, CorruptData, Device };

/// Base of all qvg errors; `kind()` tells which row of the spec 5 table applies.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

/// The error class of one kind.
template <ErrorKind K>
class TypedError : public Error {
 public:
  explicit TypedError(const std::string& m) : Error(K, m) {}
};

/// Bad argument value, shape, dtype, configuration or non-finite data.
class InvalidArgument : public TypedError<ErrorKind::InvalidArgument> { using TypedError::TypedError; };
/// A call pattern the packed cache does not support (non-sequential write, ...),
/// or a device this build does not support.
class Unsupported : public TypedError<ErrorKind::Unsupported> { using TypedError::TypedError; };
/// A chunk that does not fit (cache, window, sink) or a rewrite of evicted tokens.
class OutOfRange : public TypedError<ErrorKind::OutOfRange> { using TypedError::TypedError; };
/// A malformed or truncated file.
class CorruptData : public TypedError<ErrorKind::CorruptData> { using TypedError::TypedError; };
/// A failure reported by a device runtime (CUDA launch or call, allocation other
/// than out-of-memory); the message names the failing call. The state of the object
/// the call was made on is as documented by that call (basic guarantee at least).
class DeviceError : public TypedError<ErrorKind::Device> { using TypedError::TypedError; };

/// Aborts with file and line: for internal invariants only, never for user input.
[[noreturn]] void check_failed(const char* expr, const char* file, int line);

}  // namespace qvg

#define QVG_CHECK(cond) \
  do { \
    if (!(cond)) ::qvg::check_failed(#cond, __FILE__, __LINE__); \
  } while (0)
