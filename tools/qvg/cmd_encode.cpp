// `qvg encode`: a K/V tensor file (.npy / .safetensors) -> a packed `.qvgt` file.
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

struct EncodeOptions {
  std::string input, output;
  std::optional<std::string> tensor;
  CodecConfig cfg;
};

void run_encode(const EncodeOptions& o) {
  const std::filesystem::path out(o.output);
  if (out.extension() != ".qvgt")
    throw InvalidArgument(fmt::format("--output must name a .qvgt file, got '{}'", o.output));
  check_codec_flags(o.cfg);
  const Tensor x = read_tensor_file(o.input, o.tensor);
  check_codec_flags(o.cfg, x.shape().d);
  const auto t0 = std::chrono::steady_clock::now();
  const EncodedTensor enc = encode(x, o.cfg);
  const double secs = seconds_since(t0);
  write_qvgt(out, enc);
  const std::string note = codebook_dtype_note(x.shape(), x.dtype(), o.cfg);
  fmt::print("{}: {} {} -> {} bytes ({:.4f} bits/element, {:.2f}x vs bf16{}) in {:.3f} s\n", o.output, x.shape().str(),
             dtype_name(x.dtype()), enc.nbytes(), enc.bits_per_element(), 16.0 / enc.bits_per_element(),
             note.empty() ? "" : "; " + note, secs);
}

void register_encode(CLI::App& root) {
  auto o = std::make_shared<EncodeOptions>();
  CLI::App* cmd = root.add_subcommand("encode", "Encode a [B,S,H,D] (or [S,H,D]) tensor with PRQ into a .qvgt file");
  add_input_tensor_flag(*cmd, o->input);
  cmd->add_option("--output,-o", o->output, "output .qvgt file (written only on success)")->required();
  add_tensor_name_flag(*cmd, o->tensor);
  add_codec_flags(*cmd, o->cfg);
  cmd->callback([o] { run_encode(*o); });
}

QVG_REGISTER_COMMAND(register_encode);

}  // namespace
}  // namespace qvg::cli
