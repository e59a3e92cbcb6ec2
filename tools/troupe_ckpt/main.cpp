// troupe-ckpt: look inside troupe checkpoints (HDF5) from the shell.
//
//   troupe-ckpt ls FILE                  tensors: names, dtypes, shapes, bytes, totals
//   troupe-ckpt show FILE NAME           statistics and first values of one tensor
//   troupe-ckpt meta FILE                root attributes (step, run, config) and small state
//   troupe-ckpt verify FILE|DIR          checksums and structure; exit 0 valid, 1 not
//   troupe-ckpt diff A B                 per-tensor differences; exit 0 same, 1 different
//   troupe-ckpt export FILE --to OUT.safetensors
//
// Every command takes --json, --help and --allow-format-1 (read format 1 files, whose
// variable-length strings libhdf5 reads unchecked: only files you trust); trouble
// (missing, non-HDF5, truncated or foreign input, bad usage) is a one-line message on
// stderr and exit status 2.
#include <iostream>
#include <string>

#include "cli.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/version.hpp"

using namespace troupe::ckpt_tool;

namespace {

struct Entry {
  const char* name;
  Command run;
  std::vector<std::string> valued;
  const char* help;
};

const Entry kCommands[] = {
    {"ls",
     cmd_ls,
     {"section"},
     "usage: troupe-ckpt ls FILE [--section NAME] [--json]\n"
     "Lists every tensor (dataset) of the checkpoint with its dtype, shape and size, in the\n"
     "order it was saved, then the totals. --section model limits it to /model."},
    {"show",
     cmd_show,
     {"count"},
     "usage: troupe-ckpt show FILE NAME [--count N] [--json]\n"
     "Statistics of one tensor: min, max, mean, std (population), L2 norm, NaN and Inf\n"
     "counts, and its first N values (default 8). NAME is a full path (/optimizer/fc.weight/\n"
     "exp_avg), a name in /model (fc.weight), or a unique path suffix. The checksum is verified."},
    {"meta",
     cmd_meta,
     {},
     "usage: troupe-ckpt meta FILE [--json]\n"
     "The root attributes (format, version, step, epoch, world size, creation time, run id,\n"
     "config JSON) and the attributes of every group (sampler, status, optimizer, ...)."},
    {"verify",
     cmd_verify,
     {},
     "usage: troupe-ckpt verify FILE|DIR [--json]\n"
     "Checks structure and every dataset's XXH64 checksum. For a directory: every\n"
     "ckpt-*.h5 in it, which one `latest` names, and leftover temporary files.\n"
     "Exit status: 0 all valid, 1 something invalid, 2 trouble (no such file or folder)."},
    {"diff",
     cmd_diff,
     {},
     "usage: troupe-ckpt diff A B [--json]\n"
     "Compares two checkpoints tensor by tensor (dtype and shape changes, max absolute and\n"
     "relative difference, names only in A or only in B) and the attributes of their groups;\n"
     "root metadata such as creation time is shown but not compared.\n"
     "Exit status as diff(1): 0 identical bit for bit, 1 different, 2 trouble."},
    {"export",
     cmd_export,
     {"to", "section"},
     "usage: troupe-ckpt export FILE --to OUT.safetensors [--section NAME] [--json]\n"
     "Writes the tensors of /model (or --section) as a safetensors file (8-byte header\n"
     "length, JSON header, raw little-endian bytes), loadable by the Hugging Face\n"
     "safetensors library. Checksums are verified on the way."},
};

void usage(std::ostream& out) {
  out << "usage: troupe-ckpt COMMAND [ARGS] [--json] [--help]  |  troupe-ckpt --version\n\ncommands:\n"
         "  ls FILE                 list tensors, dtypes, shapes and sizes\n"
         "  show FILE NAME          statistics and first values of one tensor\n"
         "  meta FILE               root attributes, config and small state\n"
         "  verify FILE|DIR         check structure and checksums (exit 0 valid, 1 not)\n"
         "  diff A B                compare two checkpoints (exit 0 same, 1 different)\n"
         "  export FILE --to OUT    write the model as .safetensors\n\n"
         "troupe-ckpt COMMAND --help describes one command. Exit status 2 means trouble:\n"
         "a missing, non-HDF5, truncated or foreign file, or bad usage.\n\n"
         "--allow-format-1 reads format 1 files (troupe before 2.0), whose variable-length\n"
         "strings libhdf5 reads without bounds checks: use it only on files you trust.\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(std::cerr);
    return kTrouble;
  }
  std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    usage(std::cout);
    return kOk;
  }
  if (command == "--version") {
    std::cout << "troupe-ckpt (troupe) " << troupe::version() << "\n";
    return kOk;
  }
  for (const Entry& e : kCommands) {
    if (command != e.name) continue;
    try {
      Args args = parse_args(argc, argv, e.valued);
      args.command = command;
      if (args.help) {
        std::cout << e.help << "\n";
        return kOk;
      }
      return e.run(args, std::cout);
    } catch (const troupe::InvalidArgument& err) {
      std::cerr << "troupe-ckpt " << command << ": " << one_line(err.what()) << "\n"
                << "(troupe-ckpt " << command << " --help for usage)\n";
      return kTrouble;
    } catch (const std::exception& err) {
      std::cerr << "troupe-ckpt " << command << ": " << one_line(err.what()) << "\n";
      return kTrouble;
    }
  }
  std::cerr << "troupe-ckpt: unknown command '" << command << "'\n\n";
  usage(std::cerr);
  return kTrouble;
}
