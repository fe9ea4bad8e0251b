// The packed-cache policy flags (see cache_flags.h).
#include "cache_flags.h"

#include "cli_util.h"
#include "qvg/settings.h"

namespace qvg::cli {

namespace {

// The flag's text as the setting `name`'s value: the settings table's one parser and
// its range (qvg/settings.h), the message naming the flag.
SettingValue setting_flag(QuantArgs& q, const char* name, const char* flag, const std::string& text) {
  const Setting& s = *find_setting(name);
  const SettingValue v = parse_setting(s, text, flag);
  check_setting(s, v, flag);
  s.set(q, v);
  return v;
}

}  // namespace

void apply_cache_flags(const CacheFlags& f, SinkSpan preset_sink_span, QuantArgs& q) {
  setting_flag(q, "span_chunks", "--span-chunks", f.span_chunks);
  setting_flag(q, "span_mode", "--span-mode", f.span_mode);
  setting_flag(q, "span_break_ratio", "--span-break-ratio", f.span_break_ratio);
  setting_flag(q, "refine_recent", "--refine-recent", f.refine_recent);
  setting_flag(q, "refine_bits", "--refine-bits", f.refine_bits);
  setting_flag(q, "keep_recent_chunks", "--keep-recent", f.keep_recent);
  setting_flag(q, "sink_keep_chunks", "--sink-keep", f.sink_keep);
  q.sink = !f.no_sink;
  if (f.sink_span)
    setting_flag(q, "sink_span", "--sink-span", *f.sink_span);
  else
    q.sink_span = preset_sink_span;
}

}  // namespace qvg::cli
