// A word count over Moby-Dick as a map-reduce over tasks and object references, the
// pattern of Ray's map-reduce examples.
//
//   mpirun -np 4 build/examples/map_reduce [--text PATH] [--chunks N] [--reducers R] [--top K]
//
// Rank 0 reads the text and keeps its chunks in its own object store (rt.put). Each
// map task (count_words, run by rt.map on whichever rank has room) fetches its chunk,
// counts the words and keeps the counts on its own rank, cut into one partition per
// reducer (this_call::runtime().put); it returns only their ObjectRefs. Each reduce
// task (merge, rt.submit) fetches its partitions straight from the mappers' ranks --
// the counts never pass through rank 0 -- and returns the partition's totals and its
// most frequent words. Rank 0 checks the result against a direct count of the text.
// Once it drops its references, every rank's store empties (reference counting),
// which the last line shows.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>

#include "char_corpus.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/actors/this_call.hpp"

using namespace troupe;

namespace {

using Counts = std::map<std::string, std::int64_t>;
using Ranked = std::vector<std::pair<std::string, std::int64_t>>;

// Words are runs of ASCII letters, lower-cased.
template <class F>
void for_each_word(std::string_view text, F&& f) {
  std::string word;
  for (const char c : text) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      word += static_cast<char>(c | 0x20);
    } else if (!word.empty()) {
      f(word);
      word.clear();
    }
  }
  if (!word.empty()) f(word);
}

// FNV-1a: the same partition for a word on every rank and in every run.
int partition_of(const std::string& word, int partitions) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char c : word) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<int>(h % static_cast<std::uint64_t>(partitions));
}

// Most frequent first; ties in alphabetical order.
Ranked most_frequent(const Counts& counts, std::size_t top) {
  Ranked all(counts.begin(), counts.end());
  const auto n = std::min(top, all.size());
  std::partial_sort(
      all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(),
      [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; });
  all.resize(n);
  return all;
}

struct MapInput {
  ObjectRef<std::string> chunk;
  int reducers = 1;
  template <class A>
  void serialize(A& a) {
    a(chunk, reducers);
  }
};

struct Partition {  // what a reducer returns
  std::int64_t words = 0;
  std::int64_t distinct = 0;
  Ranked top;
  template <class A>
  void serialize(A& a) {
    a(words, distinct, top);
  }
};

std::vector<ObjectRef<Counts>> count_words(MapInput input) {
  const std::string text = input.chunk.get();  // from rank 0's store
  std::vector<Counts> parts(static_cast<std::size_t>(input.reducers));
  for_each_word(text,
                [&](const std::string& w) { ++parts[static_cast<std::size_t>(partition_of(w, input.reducers))][w]; });
  Runtime& rt = this_call::runtime();
  std::vector<ObjectRef<Counts>> refs;
  for (const Counts& part : parts) refs.push_back(rt.put(part));  // kept here
  return refs;
}

Partition merge(std::vector<ObjectRef<Counts>> parts, int top) {
  std::vector<Future<Counts>> fetches;
  for (const auto& part : parts) fetches.push_back(part.fetch());  // all at once, from the mappers' ranks
  Counts total;
  for (auto& f : fetches)
    for (const auto& [word, n] : f.get()) total[word] += n;
  Partition out;
  out.distinct = static_cast<std::int64_t>(total.size());
  for (const auto& [word, n] : total) out.words += n;
  out.top = most_frequent(total, static_cast<std::size_t>(top));
  return out;
}

std::size_t store_bytes() { return this_call::runtime().object_store_size(); }

struct Flags {
  std::string text = TROUPE_TEXT_PATH;
  int chunks = 0;    // 0: 4 a rank
  int reducers = 0;  // 0: one a rank
  int top = 10;
};

Flags parse_flags(int argc, char** argv) {
  const char* usage = "usage: map_reduce [--text PATH] [--chunks N] [--reducers R] [--top K]\n";
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) TROUPE_THROW(InvalidArgument, flag, " needs a value\n", usage);
    const std::string value = argv[++i];
    int* number = flag == "--chunks"     ? &flags.chunks
                  : flag == "--reducers" ? &flags.reducers
                  : flag == "--top"      ? &flags.top
                                         : nullptr;
    if (flag == "--text") {
      flags.text = value;
    } else if (number != nullptr) {
      std::size_t used = 0;
      try {
        *number = std::stoi(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || *number < 1)
        TROUPE_THROW(InvalidArgument, "bad value '", value, "' for ", flag, " (a whole number >= 1)\n", usage);
    } else {
      TROUPE_THROW(InvalidArgument, "unknown flag ", flag, "\n", usage);
    }
  }
  return flags;
}

// Every rank's store, asked of each rank by a task placed there.
std::vector<std::size_t> stores(Runtime& rt) {
  std::vector<Future<std::size_t>> asks;
  for (int r = 0; r < rt.size(); ++r) asks.push_back(rt.submit<&store_bytes>(TaskOptions{.rank = r}));
  std::vector<std::size_t> out;
  for (auto& f : asks) out.push_back(f.get());
  return out;
}

std::string join(const std::vector<std::size_t>& v) {
  std::string s;
  for (const auto x : v) {
    if (!s.empty()) s += ' ';
    s += std::to_string(x);
  }
  return s;
}

int drive(Runtime& rt, const Flags& flags) {
  const std::string text = examples::read_text_file(flags.text);
  const int chunks = flags.chunks > 0 ? flags.chunks : 4 * rt.size();
  const int reducers = flags.reducers > 0 ? flags.reducers : rt.size();
  const auto start = std::chrono::steady_clock::now();
  int mapped_on = 0;
  Partition result;
  std::vector<Partition> partitions;
  {
    // Chunks end at a word's end, so no word is cut in two.
    std::vector<MapInput> inputs;
    std::size_t begin = 0;
    for (int i = 1; i <= chunks; ++i) {
      std::size_t end =
          i == chunks ? text.size()
                      : std::max(begin, text.size() * static_cast<std::size_t>(i) / static_cast<std::size_t>(chunks));
      while (end < text.size() && std::isalpha(static_cast<unsigned char>(text[end]))) ++end;
      inputs.push_back({rt.put(text.substr(begin, end - begin)), reducers});
      begin = end;
    }
    const std::vector<std::vector<ObjectRef<Counts>>> mapped = rt.map<&count_words>(inputs).get();
    std::vector<bool> ranks(static_cast<std::size_t>(rt.size()));
    for (const auto& refs : mapped) ranks[static_cast<std::size_t>(refs.at(0).rank())] = true;
    mapped_on = static_cast<int>(std::count(ranks.begin(), ranks.end(), true));
    const std::vector<std::size_t> after_map = stores(rt);
    std::printf("map: %d chunks of %zu bytes counted on %d rank(s); bytes in each rank's store: %s\n", chunks,
                text.size(), mapped_on, join(after_map).c_str());

    std::vector<Future<Partition>> reduces;
    for (int p = 0; p < reducers; ++p) {
      std::vector<ObjectRef<Counts>> parts;
      for (const auto& refs : mapped) parts.push_back(refs.at(static_cast<std::size_t>(p)));
      reduces.push_back(rt.submit<&merge>(parts, flags.top));
    }
    Counts top;
    for (auto& f : reduces) {
      partitions.push_back(f.get());
      result.words += partitions.back().words;
      result.distinct += partitions.back().distinct;
      for (const auto& [word, n] : partitions.back().top) top[word] = n;
    }
    result.top = most_frequent(top, static_cast<std::size_t>(flags.top));
  }  // every reference dropped: the stores empty
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  Counts direct;
  for_each_word(text, [&](const std::string& w) { ++direct[w]; });
  std::int64_t direct_words = 0;
  for (const auto& [word, n] : direct) direct_words += n;
  const bool same = result.words == direct_words && result.distinct == static_cast<std::int64_t>(direct.size()) &&
                    result.top == most_frequent(direct, static_cast<std::size_t>(flags.top));
  std::printf("reduce: %d partitions; %lld words, %lld distinct, in %.2f s\n", reducers,
              static_cast<long long>(result.words), static_cast<long long>(result.distinct), seconds);
  for (const auto& [word, n] : result.top) std::printf("  %-12s %lld\n", word.c_str(), static_cast<long long>(n));
  std::printf("%s\n", same ? "matches a direct count of the text" : "DIFFERS from a direct count of the text");

  // Releases travel as messages: wait (bounded) for them to arrive.
  std::vector<std::size_t> left = stores(rt);
  for (int i = 0; i < 500 && std::any_of(left.begin(), left.end(), [](std::size_t b) { return b > 0; }); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    left = stores(rt);
  }
  const bool freed = std::all_of(left.begin(), left.end(), [](std::size_t b) { return b == 0; });
  std::printf("bytes left in each rank's store once rank 0 let go: %s%s\n", join(left).c_str(),
              freed ? "" : " (NOT freed)");
  return same && freed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Runtime rt(argc, argv);
  int status = 0;
  try {
    const Flags flags = parse_flags(argc, argv);
    if (rt.rank() == 0) status = drive(rt, flags);
  } catch (const std::exception& e) {
    actors::print_error("map_reduce", e, rt.rank());
    status = 2;
  }
  rt.shutdown();
  return status;
}
