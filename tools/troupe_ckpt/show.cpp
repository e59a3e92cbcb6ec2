// troupe-ckpt show: statistics of one tensor. Accumulates in double, skipping NaN and
// Inf for min/max/mean/std/L2 (they are counted separately) so one bad value does not
// hide the shape of the rest.
#include <cmath>
#include <limits>
#include <ostream>

#include "cli.hpp"
#include "json.hpp"

namespace troupe::ckpt_tool {

int cmd_show(const Args& args, std::ostream& out) {
  TROUPE_CHECK(args.positional.size() == 2, "expects FILE NAME, got ", args.positional.size(), " arguments");
  std::int64_t count = 8;
  if (auto it = args.options.find("count"); it != args.options.end()) {
    try {
      count = std::stoll(it->second);
    } catch (const std::exception&) {
      count = -1;
    }
    TROUPE_CHECK(count >= 0, "--count needs a non-negative integer, got '", it->second, "'");
  }
  checkpoint::FileReader file(args.positional[0], read_options(args));
  std::string path = resolve_tensor(file, args.positional[1]);
  tensor::Tensor t = file.read(path);
  std::vector<double> v = t.numel() ? t.to_vector<double>() : std::vector<double>{};

  std::int64_t nan = 0, inf = 0, finite = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0, sq = 0;
  for (double x : v) {
    if (std::isnan(x)) {
      ++nan;
      continue;
    }
    if (std::isinf(x)) {
      ++inf;
      continue;
    }
    ++finite;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
    sq += x * x;
  }
  double nan_v = std::numeric_limits<double>::quiet_NaN();
  double mean = finite ? sum / finite : nan_v;
  double var = finite ? std::max(0.0, sq / finite - mean * mean) : nan_v;
  double stddev = std::sqrt(var), l2 = std::sqrt(sq);
  if (!finite) lo = hi = nan_v;
  std::size_t first = std::min<std::size_t>(v.size(), static_cast<std::size_t>(count));

  if (args.json) {
    std::vector<std::string> dims, values;
    for (auto d : t.shape()) dims.push_back(json_int(d));
    for (std::size_t i = 0; i < first; ++i) values.push_back(json_number(v[i]));
    out << JsonObject()
               .add("file", json_string(file.path()))
               .add("name", json_string(path))
               .add("dtype", json_string(tensor::dtype_name(t.dtype())))
               .add("shape", json_array(dims))
               .add("numel", json_int(t.numel()))
               .add("min", json_number(lo))
               .add("max", json_number(hi))
               .add("mean", json_number(mean))
               .add("std", json_number(stddev))
               .add("l2", json_number(l2))
               .add("nan", json_int(nan))
               .add("inf", json_int(inf))
               .add("first", json_array(values))
               .str()
        << "\n";
    return kOk;
  }
  out << path << "  " << tensor::dtype_name(t.dtype()) << " " << shape_string(t.shape()) << "  (" << t.numel()
      << " elements, " << human_bytes(t.nbytes()) << ", checksum ok)\n";
  out << "min " << number(lo) << "  max " << number(hi) << "  mean " << number(mean) << "  std " << number(stddev)
      << "  l2 " << number(l2) << "  nan " << nan << "  inf " << inf << "\n";
  out << "first " << first << ":";
  for (std::size_t i = 0; i < first; ++i) out << (i ? ", " : " ") << number(v[i]);
  out << "\n";
  return kOk;
}

}  // namespace troupe::ckpt_tool
