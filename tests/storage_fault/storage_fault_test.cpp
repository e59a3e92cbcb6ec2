// libtroupe_iofault.so itself: storage_fault_probe runs under it in a child process
// (LD_PRELOAD and TROUPE_IOFAULT in the child's environment only) and prints what each
// of its file calls returned; the tests read those lines, the shim's stderr and the
// counts file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

struct Child {
  int status = 0;
  std::string out, err;
  bool exited_ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

class IoFaultShim : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "troupe-iofault-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    watched_ = dir_ / "watched";
    fs::create_directory(watched_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Runs the probe with `calls` under the shim told `spec` (and, when given, to append
  // its counts to `counts`), and waits for it.
  Child probe(const std::string& spec, const std::vector<std::string>& calls, const std::string& counts = "") {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0 && std::strncmp(*e, "TROUPE_IOFAULT", 14) != 0) env.push_back(*e);
    env.push_back(std::string("LD_PRELOAD=") + TROUPE_IOFAULT_LIBRARY);
    env.push_back("TROUPE_IOFAULT=" + spec);
    if (!counts.empty()) env.push_back("TROUPE_IOFAULT_COUNTS=" + counts);
    std::vector<std::string> args{TROUPE_IOFAULT_PROBE};
    args.insert(args.end(), calls.begin(), calls.end());
    const fs::path out = dir_ / "probe.out", err = dir_ / "probe.err";
    pid_t pid = fork();
    if (pid == 0) {
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      for (auto& e : env) envp.push_back(e.data());
      argv.push_back(nullptr);
      envp.push_back(nullptr);
      rlimit no_core{0, 0};  // the malformed-spec test aborts the child on purpose
      setrlimit(RLIMIT_CORE, &no_core);
      int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644),
          e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(126);
      close_range(3, ~0U, 0);  // so the probe's first open is fd 3, as the tests expect
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    Child child;
    EXPECT_GT(pid, 0) << "fork: " << std::strerror(errno);
    if (pid > 0) {
      EXPECT_EQ(waitpid(pid, &child.status, 0), pid);
    }
    child.out = read(out);
    child.err = read(err);
    return child;
  }

  static std::string read(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // The probe's result lines without their timings: "write -> 10".
  static std::vector<std::string> results(const Child& child) {
    static const std::regex timing(" in [0-9]+ ms$");
    std::vector<std::string> lines;
    std::istringstream in(child.out);
    for (std::string line; std::getline(in, line);) lines.push_back(std::regex_replace(line, timing, ""));
    return lines;
  }

  std::string file(const std::string& name) const { return (watched_ / name).string(); }
  std::string watch() const { return "path=" + watched_.string() + "/"; }

  fs::path dir_, watched_;
};

TEST_F(IoFaultShim, TheThirdWriteToAWatchedFileFailsWithTheErrorAsked) {
  Child child = probe(watch() + ",op=write,nth=3,err=ENOSPC",
                      {"open", file("a"), "write", "10", "write", "10", "write", "10", "write", "10"});
  ASSERT_TRUE(child.exited_ok()) << child.err;
  EXPECT_EQ(results(child),
            (std::vector<std::string>{"open -> 3", "write -> 10", "write -> 10", "write -> ENOSPC", "write -> 10"}));
  EXPECT_NE(child.err.find("troupe-iofault: failing write #3 on " + file("a") + ": ENOSPC\n"), std::string::npos)
      << child.err;
  EXPECT_EQ(fs::file_size(file("a")), 30u);
}

TEST_F(IoFaultShim, CallsOutsideThePrefixAreNeverCounted) {
  const std::string other = (dir_ / "watched-not").string();  // shares the prefix's text but for the '/'
  Child child = probe(watch() + ",op=write,nth=1,err=EIO",
                      {"open", other, "write", "4", "write", "4", "close", "open", file("b"), "write", "4"});
  ASSERT_TRUE(child.exited_ok()) << child.err;
  EXPECT_EQ(results(child), (std::vector<std::string>{"open -> 3", "write -> 4", "write -> 4", "close -> 0",
                                                      "open -> 3", "write -> EIO"}));
}

TEST_F(IoFaultShim, RelativePathsAreJudgedAgainstTheWorkingDirectory) {
  Child child = probe(watch() + ",op=open,nth=2,err=EACCES",
                      {"cd", dir_.string(), "open", "watched/c", "close", "open", "./x/../watched/c", "open", "c"});
  ASSERT_TRUE(child.exited_ok()) << child.err;
  EXPECT_EQ(results(child),
            (std::vector<std::string>{"cd -> 0", "open -> 3", "close -> 0", "open -> EACCES", "open -> 3"}));
  EXPECT_NE(child.err.find("failing open #2 on " + file("c") + ": EACCES"), std::string::npos) << child.err;
}

TEST_F(IoFaultShim, ErrShortTransfersHalfTheBytes) {
  Child child = probe(
      watch() + ",op=write,nth=1,count=2,err=short",
      {"open", file("d"), "write", "10", "writev", "9", "write", "1", "close", "openr", file("d"), "read", "100"});
  ASSERT_TRUE(child.exited_ok()) << child.err;
  EXPECT_EQ(results(child), (std::vector<std::string>{"open -> 3", "write -> 5", "writev -> 4", "write -> 1",
                                                      "close -> 0", "openr -> 3", "read -> 10"}));
  EXPECT_NE(child.err.find("failing write #1 on " + file("d") + ": short (5 of 10 bytes)"), std::string::npos)
      << child.err;

  Child reader = probe(watch() + ",op=read,nth=1,err=short", {"openr", file("d"), "read", "8"});
  EXPECT_EQ(results(reader), (std::vector<std::string>{"openr -> 3", "read -> 4"}));
}

TEST_F(IoFaultShim, CountZeroFailsEveryCallFromTheNth) {
  Child child = probe(watch() + ",op=write,nth=2,count=0,err=EDQUOT",
                      {"open", file("e"), "write", "1", "write", "1", "write", "1", "write", "1"});
  EXPECT_EQ(results(child), (std::vector<std::string>{"open -> 3", "write -> 1", "write -> EDQUOT", "write -> EDQUOT",
                                                      "write -> EDQUOT"}));
}

TEST_F(IoFaultShim, AStallDelaysTheCallThenPerformsIt) {
  Child child = probe(watch() + ",op=fsync,nth=1,stall_ms=200", {"open", file("f"), "fsync", "fsync"});
  ASSERT_TRUE(child.exited_ok()) << child.err;
  EXPECT_EQ(results(child), (std::vector<std::string>{"open -> 3", "fsync -> 0", "fsync -> 0"}));
  std::smatch took;
  ASSERT_TRUE(std::regex_search(child.out, took, std::regex("fsync -> 0 in ([0-9]+) ms")));
  EXPECT_GE(std::stoi(took[1]), 200) << child.out;  // a lower bound only: a loaded machine is slower
  EXPECT_NE(child.err.find("stalling fsync #1 on " + file("f") + " for 200 ms"), std::string::npos) << child.err;
}

TEST_F(IoFaultShim, ADuplicateCarriesTheMarkAndACloseClearsIt) {
  Child child = probe(watch() + ",op=write,nth=1,err=EROFS",
                      {"open", file("g"), "dup", "write", "1", "close", "open", (dir_ / "h").string(), "write", "1"});
  EXPECT_EQ(results(child), (std::vector<std::string>{"open -> 3", "dup -> 4", "write -> EROFS", "close -> 0",
                                                      "open -> 4", "write -> 1"}));
}

TEST_F(IoFaultShim, TheCountsFileListsEveryWatchedCallByKind) {
  const std::string counts = (dir_ / "counts").string();
  Child child = probe(watch(), {"open",   file("i"), "write",   "3",      "writev",  "3",    "fsync",
                                "close",  "openr",   file("i"), "read",   "8",       "read", "8",
                                "rename", file("i"), file("j"), "unlink", file("j"), "open", (dir_ / "k").string(),
                                "write",  "1"},
                      counts);
  ASSERT_TRUE(child.exited_ok()) << child.err;
  EXPECT_EQ(child.err, "");
  std::smatch line;
  const std::string text = read(counts);
  ASSERT_TRUE(std::regex_match(text, line, std::regex("(.*) pid=[0-9]+\n"))) << text;
  EXPECT_EQ(line[1], "open=2 read=2 write=2 fsync=1 rename=1 unlink=1");
}

TEST_F(IoFaultShim, StreamsAndFilesystemCallsAreCounted) {
  const std::string counts = (dir_ / "counts").string();
  Child child = probe(
      watch(),
      {"ofstream", file("l"), "5", "ifstream", file("l"), "fs_rename", file("l"), file("m"), "fs_remove", file("m")},
      counts);
  ASSERT_TRUE(child.exited_ok()) << child.err;
  EXPECT_EQ(results(child),
            (std::vector<std::string>{"ofstream -> ok", "ifstream -> 5", "fs_rename -> 0", "fs_remove -> 0"}));
  // ifstream reads until a read returns 0: two reads for a 5-byte file.
  EXPECT_NE(read(counts).find("open=2 read=2 write=1 fsync=0 rename=1 unlink=1 "), std::string::npos) << read(counts);

  Child failing = probe(watch() + ",op=write,nth=1,err=ENOSPC", {"ofstream", file("n"), "5"});
  EXPECT_EQ(results(failing), std::vector<std::string>{"ofstream -> failed"});
}

TEST_F(IoFaultShim, AMalformedSpecAbortsTheProcessAtLoad) {
  for (const std::string& spec : std::vector<std::string>{
           watch() + ",op=write,nth=0,err=EIO", watch() + ",op=write,nth=1", watch() + ",op=fsync,nth=1,err=short",
           "op=write,nth=1,err=EIO", watch() + ",op=write,nth=1,err=ENOPE", watch() + ",colour=red"}) {
    Child child = probe(spec, {"open", file("o")});
    EXPECT_TRUE(WIFSIGNALED(child.status) && WTERMSIG(child.status) == SIGABRT) << spec << ": status " << child.status;
    EXPECT_EQ(child.out, "") << spec;
    EXPECT_NE(child.err.find("troupe-iofault: bad TROUPE_IOFAULT='" + spec + "': "), std::string::npos) << child.err;
  }
}

}  // namespace
