// Where GptStage cuts a GPT's blocks into pipeline stages (pipeline.hpp).
#include <limits>
#include <string>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/shard_range.hpp"

namespace troupe::parallel {

PipelineCut parse_pipeline_cut(std::string_view name) {
  if (name == "parameters") return PipelineCut::parameters;
  if (name == "uniform") return PipelineCut::uniform;
  TROUPE_THROW(InvalidArgument, "unknown pipeline cut '", name, "': parameters or uniform");
}

const char* pipeline_cut_name(PipelineCut cut) { return cut == PipelineCut::parameters ? "parameters" : "uniform"; }

// Two passes of one dynamic programme over (stages so far, blocks so far): the least
// largest stage, then, with every stage within it, the least sum of squares. p x n^2
// steps: a few million for 80 blocks over 64 stages, once per build.
std::vector<std::int64_t> balanced_cut(const std::vector<std::int64_t>& sizes, std::int64_t first_extra,
                                       std::int64_t last_extra, int stages) {
  const auto n = static_cast<std::int64_t>(sizes.size());
  TROUPE_CHECK(stages >= 1 && n >= stages, "balanced_cut: ", n, " blocks do not fill ", stages, " stages");
  std::vector<std::int64_t> prefix(static_cast<std::size_t>(n) + 1, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    TROUPE_CHECK(sizes[static_cast<std::size_t>(i)] >= 0, "balanced_cut: block ", i, " has a negative size");
    prefix[static_cast<std::size_t>(i) + 1] = prefix[static_cast<std::size_t>(i)] + sizes[static_cast<std::size_t>(i)];
  }
  const auto load = [&](int s, std::int64_t i, std::int64_t j) {  // stage s holding blocks [i, j)
    return prefix[static_cast<std::size_t>(j)] - prefix[static_cast<std::size_t>(i)] + (s == 0 ? first_extra : 0) +
           (s == stages - 1 ? last_extra : 0);
  };
  const auto at = [n](int s, std::int64_t j) {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(n + 1) + static_cast<std::size_t>(j);
  };
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  const std::size_t cells = static_cast<std::size_t>(stages + 1) * static_cast<std::size_t>(n + 1);

  // largest[s, j]: the least largest stage of s stages over blocks [0, j).
  std::vector<std::int64_t> largest(cells, kNone);
  largest[at(0, 0)] = 0;
  for (int s = 1; s <= stages; ++s)
    for (std::int64_t j = s; j <= n - (stages - s); ++j)
      for (std::int64_t i = s - 1; i < j; ++i)
        if (largest[at(s - 1, i)] != kNone)
          largest[at(s, j)] = std::min(largest[at(s, j)], std::max(largest[at(s - 1, i)], load(s - 1, i, j)));
  const std::int64_t bound = largest[at(stages, n)];

  // even[s, j]: the least sum of squares of such s stages, each within the bound.
  constexpr double kUnreached = std::numeric_limits<double>::infinity();
  std::vector<double> even(cells, kUnreached);
  std::vector<std::int64_t> from(cells, -1);
  even[at(0, 0)] = 0;
  for (int s = 1; s <= stages; ++s)
    for (std::int64_t j = s; j <= n - (stages - s); ++j)
      for (std::int64_t i = s - 1; i < j; ++i) {
        const std::int64_t l = load(s - 1, i, j);
        if (l > bound || even[at(s - 1, i)] == kUnreached) continue;
        const double sum = even[at(s - 1, i)] + static_cast<double>(l) * static_cast<double>(l);
        if (sum < even[at(s, j)]) {
          even[at(s, j)] = sum;
          from[at(s, j)] = i;
        }
      }
  std::vector<std::int64_t> cut(static_cast<std::size_t>(stages) + 1);
  cut[static_cast<std::size_t>(stages)] = n;
  for (int s = stages; s > 0; --s) cut[static_cast<std::size_t>(s) - 1] = from[at(s, cut[static_cast<std::size_t>(s)])];
  return cut;
}

std::vector<std::int64_t> gpt_pipeline_cut(const nn::GPTConfig& config, int stages, PipelineCut cut) {
  TROUPE_CHECK(stages >= 1 && config.n_layer >= stages, "GptStage: ", config.n_layer, " blocks do not fill ", stages,
               " pipeline stages");
  std::vector<std::int64_t> bounds;
  if (cut == PipelineCut::uniform || stages == 1) {
    for (int s = 0; s < stages; ++s) bounds.push_back(shard_range(config.n_layer, s, stages).first);
    bounds.push_back(config.n_layer);
    return bounds;
  }
  // The counts of a model described on the meta device: nothing allocated.
  const nn::GPT meta(config, 0, tensor::DType::f32, tensor::Device::meta());
  const auto count = [](nn::Module& module) {
    std::int64_t n = 0;
    for (const nn::Parameter* p : module.parameters()) n += p->data.numel();
    return n;
  };
  const auto transformer = meta.shared_child("transformer");
  const auto blocks = transformer->shared_child("h");
  std::vector<std::int64_t> sizes;
  for (std::int64_t i = 0; i < config.n_layer; ++i) sizes.push_back(count(*blocks->shared_child(std::to_string(i))));
  // In state, a parameter's 16 bytes with its gradient and AdamW's moments: the first
  // stage holds the tied table with its gradient alone (the last steps it), 8 bytes.
  const std::int64_t table = count(*transformer->shared_child("wte"));
  return balanced_cut(sizes, table / 2 + count(*transformer->shared_child("wpe")),
                      count(*transformer->shared_child("ln_f")) + table, stages);
}

}  // namespace troupe::parallel
