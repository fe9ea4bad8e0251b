// `qvg eval`: encode + decode one tensor and report size and error, next to the RTN
// baseline at the same bits and block size.
//
// Figures: bits per element (stored bytes * 8 / elements), compression ratio vs bf16
// (16 / bits per element), relative MSE ||X - X'||^2 / ||X||^2 accumulated in fp64
// over the values as stored in the input and output dtype, SNR = -10 log10(rel_mse)
// in dB, and wall times. With --method rtn|kivi|quarot the primary figures are those
// of that baseline; its round trip is one call, so encode_s is the whole round trip
// and decode_s is null (JSON) / "-" (text). rel_mse 0 gives an infinite SNR, printed
// as "inf" and as null in JSON.
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "codec_flags.h"
#include "command.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/eval/baselines.h"
#include "qvg/io.h"

namespace qvg::cli {
namespace {

struct EvalOptions {
  std::string input;
  std::optional<std::string> tensor;
  std::string method = "qvg";
  std::string role = "key";
  bool json = false;
  CodecConfig cfg;
};

struct Figures {
  double bits_per_element = 0;
  double rel_mse = 0;
  double snr_db = 0;
  double encode_s = 0;
  std::optional<double> decode_s;
};

// ||x - y||^2 / ||x||^2 in fp64; 0 when both are zero, +inf when only x is.
double relative_mse(const Tensor& x, const Tensor& y) {
  QVG_CHECK(x.shape() == y.shape());
  const size_t n = static_cast<size_t>(x.shape().numel());
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = load_f32(x.data(), x.dtype(), i);
    const double b = load_f32(y.data(), y.dtype(), i);
    err += (a - b) * (a - b);
    ref += a * a;
  }
  if (ref == 0) return err == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return err / ref;
}

void set_error(Figures& f, const Tensor& x, const Tensor& decoded) {
  f.rel_mse = relative_mse(x, decoded);
  f.snr_db = f.rel_mse == 0 ? std::numeric_limits<double>::infinity() : -10.0 * std::log10(f.rel_mse);
}

TensorRole parse_role(const std::string& s) {
  if (s == "key") return TensorRole::Key;
  if (s == "value") return TensorRole::Value;
  throw InvalidArgument(fmt::format("--role must be key or value, got '{}'", s));
}

Figures run_baseline(BaselineMethod m, const Tensor& x, TensorRole role, const CodecConfig& cfg) {
  BaselineConfig b;
  b.bits = cfg.bits;
  b.block_size = cfg.block_size;
  const auto t0 = std::chrono::steady_clock::now();
  const RoundTrip rt = baseline_roundtrip(m, x, role, b);
  Figures f;
  f.encode_s = seconds_since(t0);
  f.bits_per_element = rt.bits_per_element;
  set_error(f, x, rt.decoded);
  return f;
}

// JSON number, or null for a non-finite value.
nlohmann::json num(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}
std::string txt(double v, const char* fmt_spec) {
  return std::isfinite(v) ? fmt::format(fmt::runtime(fmt_spec), v) : std::string("inf");
}

void run_eval(const EvalOptions& o) {
  check_codec_flags(o.cfg);
  const TensorRole role = parse_role(o.role);
  std::optional<BaselineMethod> baseline;
  if (o.method != "qvg") {
    try {
      baseline = parse_baseline_method(o.method);
    } catch (const InvalidArgument&) {
      throw InvalidArgument(fmt::format("--method must be one of qvg, rtn, kivi, quarot, got '{}'", o.method));
    }
  }
  const Tensor x = read_tensor_file(o.input, o.tensor);
  check_codec_flags(o.cfg, x.shape().d);

  Figures primary;
  if (baseline) {
    primary = run_baseline(*baseline, x, role, o.cfg);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    const EncodedTensor enc = encode(x, o.cfg);
    primary.encode_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    const Tensor decoded = decode(enc, o.cfg.threads);
    primary.decode_s = seconds_since(t1);
    primary.bits_per_element = enc.bits_per_element();
    set_error(primary, x, decoded);
  }
  const Figures rtn = run_baseline(BaselineMethod::RTN, x, role, o.cfg);
  const double ratio = 16.0 / primary.bits_per_element;

  if (o.json) {
    nlohmann::json j = {
        {"input", o.input},
        {"shape", {x.shape().b, x.shape().s, x.shape().h, x.shape().d}},
        {"dtype", dtype_name(x.dtype())},
        {"method", o.method},
        {"config", o.cfg.describe()},
        {"bits_per_element", num(primary.bits_per_element)},
        {"compression_ratio", num(ratio)},
        {"codebook_dtype", baseline ? nlohmann::json() : nlohmann::json(dtype_name(x.dtype()))},
        {"rel_mse", num(primary.rel_mse)},
        {"snr_db", num(primary.snr_db)},
        {"encode_s", num(primary.encode_s)},
        {"decode_s", primary.decode_s ? num(*primary.decode_s) : nlohmann::json()},
        {"baselines",
         {{"rtn",
           {{"bits_per_element", num(rtn.bits_per_element)},
            {"rel_mse", num(rtn.rel_mse)},
            {"snr_db", num(rtn.snr_db)}}}}},
    };
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("input              {} {} {}\n", o.input, x.shape().str(), dtype_name(x.dtype()));
  fmt::print(
      "method             {} ({})\n", o.method,
      baseline ? fmt::format("bits={} block_size={} role={}", o.cfg.bits, o.cfg.block_size, o.role) : o.cfg.describe());
  fmt::print("bits per element   {:.4f}\n", primary.bits_per_element);
  fmt::print("compression        {:.3f}x vs bf16\n", ratio);
  if (!baseline)
    if (const std::string note = codebook_dtype_note(x.shape(), x.dtype(), o.cfg); !note.empty())
      fmt::print("                   {}\n", note);
  fmt::print("relative MSE       {}\n", txt(primary.rel_mse, "{:.6e}"));
  fmt::print("SNR                {} dB\n", txt(primary.snr_db, "{:.3f}"));
  if (primary.decode_s) {
    fmt::print("encode / decode    {:.4f} s / {:.4f} s\n", primary.encode_s, *primary.decode_s);
  } else {
    fmt::print("round trip         {:.4f} s (encode + decode in one call)\n", primary.encode_s);
  }
  fmt::print("baseline rtn       {:.4f} bits/element, relative MSE {}, SNR {} dB\n", rtn.bits_per_element,
             txt(rtn.rel_mse, "{:.6e}"), txt(rtn.snr_db, "{:.3f}"));
}

void register_eval(CLI::App& root) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd =
      root.add_subcommand("eval", "Encode + decode a tensor; report bits per element, error and time vs RTN");
  add_input_tensor_flag(*cmd, o->input);
  add_tensor_name_flag(*cmd, o->tensor);
  add_value(*cmd, "--method", o->method, "qvg | rtn | kivi | quarot", "TEXT");
  add_value(*cmd, "--role", o->role, "key | value (KIVI quantizes them differently)", "TEXT");
  cmd->add_flag("--json", o->json, "print one JSON object instead of text");
  add_codec_flags(*cmd, o->cfg);
  cmd->callback([o] { run_eval(*o); });
}

QVG_REGISTER_COMMAND(register_eval);

}  // namespace
}  // namespace qvg::cli
