// troupe-ckpt diff A B: tensor by tensor, then the groups' attributes. "Identical" means
// bit for bit (memcmp), so -0.0 vs 0.0 or two NaN payloads count as different, as they
// would for a resumed run that must match an uninterrupted one exactly. Root metadata
// (creation time, run id, step) is printed but not compared: two runs always differ there.
#include <cmath>
#include <cstring>
#include <map>
#include <ostream>

#include "cli.hpp"
#include "json.hpp"

namespace troupe::ckpt_tool {

namespace {

struct TensorDiff {
  std::string name;
  std::string kind;  // identical, different, dtype, shape, missing (only in A), extra (only in B)
  std::string detail;
  double max_abs = 0, max_rel = 0;
  std::int64_t differing = 0;
};

TensorDiff compare(const checkpoint::FileReader& a, const checkpoint::FileReader& b, const checkpoint::TensorInfo& ia,
                   const checkpoint::TensorInfo& ib) {
  TensorDiff d;
  d.name = ia.path;
  if (ia.dtype != ib.dtype) {
    d.kind = "dtype";
    d.detail = std::string(tensor::dtype_name(ia.dtype)) + " -> " + std::string(tensor::dtype_name(ib.dtype));
    return d;
  }
  if (ia.shape != ib.shape) {
    d.kind = "shape";
    d.detail = shape_string(ia.shape) + " -> " + shape_string(ib.shape);
    return d;
  }
  tensor::Tensor ta = a.read(ia.path), tb = b.read(ib.path);
  if (ta.nbytes() == 0 || std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()) == 0) {
    d.kind = "identical";
    return d;
  }
  d.kind = "different";
  std::vector<double> va = ta.to_vector<double>(), vb = tb.to_vector<double>();
  const auto* ra = static_cast<const unsigned char*>(ta.raw_data());
  const auto* rb = static_cast<const unsigned char*>(tb.raw_data());
  std::size_t es = ta.element_bytes();
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::memcmp(ra + i * es, rb + i * es, es) == 0) continue;
    ++d.differing;
    double diff = std::fabs(va[i] - vb[i]);
    if (std::isnan(diff)) continue;  // NaN on one side: counted, not measured
    double scale = std::max(std::fabs(va[i]), std::fabs(vb[i]));
    d.max_abs = std::max(d.max_abs, diff);
    if (scale > 0) d.max_rel = std::max(d.max_rel, diff / scale);
  }
  return d;
}

}  // namespace

int cmd_diff(const Args& args, std::ostream& out) {
  TROUPE_CHECK(args.positional.size() == 2, "expects two files A B, got ", args.positional.size(), " arguments");
  checkpoint::FileReader a(args.positional[0], read_options(args));
  checkpoint::FileReader b(args.positional[1], read_options(args));

  std::vector<checkpoint::TensorInfo> ta = a.tensors("/"), tb = b.tensors("/");
  std::map<std::string, const checkpoint::TensorInfo*> in_b;
  for (const auto& t : tb) in_b[t.path] = &t;
  std::vector<TensorDiff> diffs;
  for (const auto& t : ta) {
    auto it = in_b.find(t.path);
    if (it == in_b.end())
      diffs.push_back({t.path, "missing", "only in A"});
    else
      diffs.push_back(compare(a, b, t, *it->second));
  }
  std::map<std::string, bool> in_a;
  for (const auto& t : ta) in_a[t.path] = true;
  for (const auto& t : tb)
    if (!in_a.count(t.path)) diffs.push_back({t.path, "extra", "only in B"});

  // Attributes of every non-root group in either file.
  std::vector<std::string> attr_diffs;
  for (const std::string& g : a.groups("/")) {
    checkpoint::Attributes x = a.attributes(g);
    checkpoint::Attributes y = b.has_group(g) ? b.attributes(g) : checkpoint::Attributes{};
    for (const auto& [k, v] : x) {
      const checkpoint::AttrValue* w = y.find(k);
      if (!w)
        attr_diffs.push_back(g + " " + k + ": " + checkpoint::to_string(v) + " -> (absent)");
      else if (*w != v)
        attr_diffs.push_back(g + " " + k + ": " + checkpoint::to_string(v) + " -> " + checkpoint::to_string(*w));
    }
    for (const auto& [k, w] : y)
      if (!x.contains(k)) attr_diffs.push_back(g + " " + k + ": (absent) -> " + checkpoint::to_string(w));
  }

  std::map<std::string, int> counts;
  for (const TensorDiff& d : diffs) ++counts[d.kind];
  bool same = counts["identical"] == static_cast<int>(diffs.size()) && attr_diffs.empty();

  checkpoint::Attributes ra = a.attributes("/"), rb = b.attributes("/");
  auto step = [](const checkpoint::Attributes& r) {
    const checkpoint::AttrValue* s = r.find("step");
    return s ? checkpoint::to_string(*s) : std::string("?");
  };
  if (args.json) {
    std::vector<std::string> items, attrs;
    for (const TensorDiff& d : diffs) {
      JsonObject o;
      o.add("name", json_string(d.name)).add("status", json_string(d.kind));
      if (!d.detail.empty()) o.add("detail", json_string(d.detail));
      if (d.kind == "different")
        o.add("max_abs", json_number(d.max_abs))
            .add("max_rel", json_number(d.max_rel))
            .add("differing", json_int(d.differing));
      items.push_back(o.str());
    }
    for (const std::string& s : attr_diffs) attrs.push_back(json_string(s));
    out << JsonObject()
               .add("a", json_string(a.path()))
               .add("b", json_string(b.path()))
               .add("identical", same ? "true" : "false")
               .add("tensors", json_array(items))
               .add("attributes", json_array(attrs))
               .str()
        << "\n";
    return same ? kOk : kNo;
  }
  out << "A " << a.path() << " (step " << step(ra) << ")\nB " << b.path() << " (step " << step(rb) << ")\n";
  for (const TensorDiff& d : diffs) {
    if (d.kind == "identical") continue;
    out << "  " << d.kind << "  " << d.name;
    if (!d.detail.empty()) out << "  " << d.detail;
    if (d.kind == "different")
      out << "  max abs " << number(d.max_abs) << "  max rel " << number(d.max_rel) << "  (" << d.differing
          << " elements)";
    out << "\n";
  }
  for (const std::string& s : attr_diffs) out << "  attribute " << s << "\n";
  out << (same ? "identical: " : "different: ") << counts["identical"] << " of " << diffs.size()
      << " tensors identical, " << counts["different"] << " different, " << counts["dtype"] + counts["shape"]
      << " changed dtype/shape, " << counts["missing"] << " only in A, " << counts["extra"] << " only in B; "
      << attr_diffs.size() << " attribute differences\n";
  return same ? kOk : kNo;
}

}  // namespace troupe::ckpt_tool
