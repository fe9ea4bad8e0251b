// src/core/enum_names.h — names of enumerations (persisted and parsed by name, never
// by number) as one table per enum: the first entry of a value is its canonical
// name, later entries are accepted aliases.
#pragma once

#include <cstddef>
#include <string_view>

#include <fmt/core.h>

#include "qvg/error.h"

namespace qvg::detail {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

/// The canonical name of v ("?" when the table lacks it).
template <class E, size_t N>
std::string_view name_in(const EnumName<E> (&table)[N], E v) {
  for (const EnumName<E>& e : table)
    if (e.value == v) return e.name;
  return "?";
}

/// The value named s (a canonical name or an alias). Throws InvalidArgument
/// "<what> must be one of <allowed>, got '<s>'".
template <class E, size_t N>
E parse_in(const EnumName<E> (&table)[N], std::string_view s, std::string_view what, std::string_view allowed) {
  for (const EnumName<E>& e : table)
    if (e.name == s) return e.value;
  throw InvalidArgument(fmt::format("{} must be one of {}, got '{}'", what, allowed, s));
}

}  // namespace qvg::detail
