// `qvg decode`: a packed `.qvgt` file -> a tensor file (.npy / .safetensors) in the
// input's dtype (spec 1.6: bf16 into .npy becomes float32 holding the exact values).
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <fmt/core.h>

#include "cli_util.h"
#include "codec_flags.h"
#include "command.h"
#include "qvg/codec.h"
#include "qvg/error.h"
#include "qvg/io.h"

namespace qvg::cli {
namespace {

struct DecodeOptions {
  std::string input, output;
  std::optional<std::string> tensor;
  std::string threads = "0";
};

void run_decode(const DecodeOptions& o) {
  const std::filesystem::path out(o.output);
  const std::string ext = out.extension().string();
  if (ext != ".npy" && ext != ".safetensors")
    throw InvalidArgument(fmt::format("--output must name a .npy or .safetensors file, got '{}'", o.output));
  if (o.tensor && ext != ".safetensors")
    throw InvalidArgument(
        fmt::format("--tensor names the tensor of a .safetensors output; '{}' is a .npy file", o.output));
  const int threads = parse_threads_flag("--threads", o.threads);
  const EncodedTensor enc = read_qvgt(o.input);
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor x = decode(enc, threads);
  const double secs = seconds_since(t0);
  write_tensor_file(out, x, o.tensor.value_or("tensor"));
  fmt::print(
      "{}: {} {} decoded from {} bytes in {:.3f} s\n", o.output, x.shape().str(),
      ext == ".npy" && x.dtype() == DType::BF16 ? "bf16 (stored as float32)" : std::string(dtype_name(x.dtype())),
      enc.nbytes(), secs);
}

void register_decode(CLI::App& root) {
  auto o = std::make_shared<DecodeOptions>();
  CLI::App* cmd =
      root.add_subcommand("decode", "Decode a .qvgt file into a [B,S,H,D] tensor file of the input's dtype");
  cmd->add_option("--input,-i", o->input, "input .qvgt file")->required();
  cmd->add_option("--output,-o", o->output,
                  "output .npy (bf16 stored as float32) or .safetensors (written only on success)")
      ->required();
  cmd->add_option("--tensor", o->tensor, "tensor name in a .safetensors output (default 'tensor')");
  add_value(*cmd, "--threads", o->threads, "worker threads (0 = all cores); never changes bits", "INT");
  cmd->callback([o] { run_decode(*o); });
}

QVG_REGISTER_COMMAND(register_decode);

}  // namespace
}  // namespace qvg::cli
