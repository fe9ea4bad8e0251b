// The measurement driver behind docs/quality/recommended-profile.csv (issue 25): one
// simulate() run per preset with several packed configurations beside one dense cache
// (the figures of a configuration do not depend on the others; the engine's and the
// issue's rows equal `qvg simulate`'s single-configuration figures). Not part of the
// build. Each configuration is LABEL=key:value,... with the engine's flag suffixes
// (kv_cache_quant_<key>), kv_cache_quant=int2 implied, sink_span the preset's unless
// given; prints preset,label,attention error,full-size peak ratio,bpe,K MSE,V MSE,
// spans,memory model matched. Build against a ci build dir B:
//   g++ -O2 -std=c++20 -fopenmp -DFMT_SHARED -Iinclude -Isrc -I$B/generated \
//     docs/quality/recommended-sweep.cpp -o sweep $B/libqvg_eval.a $B/libqvg.a -lfmt -lhwy \
//     /usr/lib/x86_64-linux-gnu/libfaiss.a -lgomp -lpthread -lblas -llapack
//   ./sweep hy-worldplay-8b eng=profile:reference rec=profile:recommended
#include <fmt/core.h>
#include <cstdio>
#include <map>
#include <string>
#include "qvg/config.h"
#include "qvg/eval/simulate.h"
#include "qvg/eval/workload.h"
using namespace qvg;
int main(int argc, char** argv) {
  SimulationConfig c;
  c.model = argv[1];
  const ModelPreset& preset = find_model_preset(c.model);
  c.context_frames = std::min<int64_t>(preset.context_frames, 72);
  c.packed.clear();
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string label = a.substr(0, eq), rest = eq == std::string::npos ? "" : a.substr(eq + 1);
    std::map<std::string, std::string> f{{"kv_cache_quant", "int2"}};
    bool sinkspan = false;
    size_t p = 0;
    while (p < rest.size()) {
      size_t q = rest.find(',', p); if (q == std::string::npos) q = rest.size();
      std::string it = rest.substr(p, q - p); auto c2 = it.find(':');
      std::string k = it.substr(0, c2);
      if (k == "sink_span") sinkspan = true;
      f["kv_cache_quant_" + k] = it.substr(c2 + 1);
      p = q + 1;
    }
    QuantArgs qa = QuantArgs::from_flags(f);
    if (!sinkspan) qa.sink_span = preset.sink_policy;
    c.packed.push_back({label, qa});
  }
  c.validate();
  SimulationResult r = simulate(c);
  for (const auto& s : r.summary) {
    double full = s.full_policy_peak_bytes ? double(s.full_dense_bytes) / double(s.full_policy_peak_bytes) : 0;
    fmt::print("{},{},{:.5f},{:.3f},{:.3f},{:.4f},{:.4f},{},{}\n", c.model, s.label, s.attention.rel_l2(), full,
               s.bits_per_element.value_or(0), s.k.rel_mse().value_or(0), s.v.rel_mse().value_or(0), s.spans, s.memory_model_matches);
    std::fflush(stdout);
  }
  fmt::print(stderr, "wall {:.1f}\n", r.wall_s);
}
