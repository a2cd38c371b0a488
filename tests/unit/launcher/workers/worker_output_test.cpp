// Worker output routing without processes: the "worker" is this test writing into the fds a
// worker would get. Console lines get the prefix at every line start (also after '\r'), an
// unfinished line waits for its end, files get the raw bytes, redirect keeps the console
// clean, a filtered rank reaches neither console nor pump, torchrun's log-dir layout, long
// lines assembled whole up to kMaxLineBytes and then cut with a marker, and a log file on a
// full disk named once while the console goes on.
#include "ddp/launch/worker_output.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace ddp::launch;
namespace fs = std::filesystem;

namespace {

struct Console {
  int out[2], err[2];
  Console() {
    REQUIRE(::pipe2(out, O_NONBLOCK) == 0);
    REQUIRE(::pipe2(err, O_NONBLOCK) == 0);
  }
  ~Console() {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
  }
  static std::string read_all(int fd) {
    std::string s;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) s.append(buf, static_cast<std::size_t>(n));
    return s;
  }
};

void put(int fd, const std::string& s) {
  REQUIRE(::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("console lines get the prefix, unfinished lines wait for their end", "[unit][launch]") {
  Console c;
  OutputPump pump(c.out[1], c.err[1]);
  WorkerSpec spec;
  pump.attach(spec, 0, "[w0]:", Std::none, Std::none, true, "");
  REQUIRE(spec.stdout_fd >= 0);
  REQUIRE(spec.stderr_fd >= 0);
  put(spec.stdout_fd, "one\ntw");
  put(spec.stderr_fd, "oops\n");
  for (int fd : pump.fds()) pump.on_readable(fd);
  CHECK(Console::read_all(c.out[0]) == "[w0]:one\n");
  CHECK(Console::read_all(c.err[0]) == "[w0]:oops\n");
  put(spec.stdout_fd, "o\r 50%\r100%\n");
  for (int fd : pump.fds()) pump.on_readable(fd);
  CHECK(Console::read_all(c.out[0]) == "[w0]:two\r[w0]: 50%\r[w0]:100%\n");
  put(spec.stdout_fd, "no newline at exit");
  pump.after_start();  // the worker's ends close: EOF follows the data
  pump.drain();
  CHECK(Console::read_all(c.out[0]) == "[w0]:no newline at exit\n");
  CHECK(pump.fds().empty());
}

TEST_CASE("an empty prefix on the console inherits the agent's fds", "[unit][launch]") {
  Console c;
  OutputPump pump(c.out[1], c.err[1]);
  WorkerSpec spec;
  pump.attach(spec, 0, "", Std::none, Std::none, true, "");
  CHECK(spec.stdout_fd == -1);
  CHECK(spec.stderr_fd == -1);
  CHECK(pump.fds().empty());
}

TEST_CASE("tee writes raw bytes to the file and prefixed lines to the console", "[unit][launch]") {
  auto dir = fs::temp_directory_path() / ("ddp_out_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    Console c;
    OutputPump pump(c.out[1], c.err[1]);
    WorkerSpec spec;
    pump.attach(spec, 1, "[w1]:", Std::none, Std::out, true, dir.string());
    put(spec.stdout_fd, "a\nb\n");
    pump.after_start();
    pump.drain();
    CHECK(Console::read_all(c.out[0]) == "[w1]:a\n[w1]:b\n");
    CHECK(slurp(dir / "stdout.log") == "a\nb\n");
    CHECK_FALSE(fs::exists(dir / "stderr.log"));  // stderr is neither teed nor redirected
  }
  fs::remove_all(dir);
}

TEST_CASE("redirect and filtered ranks keep the console clean", "[unit][launch]") {
  auto dir = fs::temp_directory_path() / ("ddp_out2_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    Console c;
    OutputPump pump(c.out[1], c.err[1]);
    WorkerSpec redirected, filtered;
    pump.attach(redirected, 0, "[w0]:", Std::all, Std::none, true, dir.string());
    pump.attach(filtered, 1, "[w1]:", Std::none, Std::none, false, "");
    CHECK(pump.fds().size() == 2);  // the files are written by the pump; /dev/null is not pumped
    put(redirected.stdout_fd, "to the file\n");
    put(filtered.stdout_fd, "to nowhere\n");
    pump.after_start();
    pump.drain();
    CHECK(Console::read_all(c.out[0]).empty());
    CHECK(slurp(dir / "stdout.log") == "to the file\n");
  }
  fs::remove_all(dir);
}

TEST_CASE("the log dir follows torchrun's layout, /dev/null disables it", "[unit][launch]") {
  auto base = fs::temp_directory_path() / ("ddp_logs_" + std::to_string(::getpid()));
  {
    RunLogDir logs(base.string(), "job7");
    CHECK(logs.enabled());
    CHECK_FALSE(logs.temporary());
    CHECK(fs::path(logs.root()).parent_path() == base);
    CHECK(fs::path(logs.root()).filename().string().rfind("job7_", 0) == 0);
    std::string a = logs.make_attempt(2);
    CHECK(a == logs.root() + "/attempt_2");
    CHECK(fs::is_directory(a));
    CHECK(fs::is_empty(a));  // a rank's directory is made when that rank is spawned
    CHECK(RunLogDir::make_rank_dir(a, 2) == a + "/2");
    CHECK(fs::is_directory(a + "/2"));
    CHECK_FALSE(fs::exists(a + "/0"));
    CHECK(RunLogDir::make_rank_dir("", 2).empty());
    logs.remove_if_temporary();
    CHECK(fs::exists(base));  // the user's directory is kept
  }
  fs::remove_all(base);
  RunLogDir none("/dev/null", "job7");
  CHECK_FALSE(none.enabled());
  CHECK(none.make_attempt(0).empty());
  RunLogDir temp("", "job8");
  CHECK(temp.temporary());
  CHECK(fs::path(temp.root()).parent_path().filename().string().rfind("torchelastic_", 0) == 0);
  temp.remove_if_temporary();
  CHECK_FALSE(fs::exists(fs::path(temp.root()).parent_path()));
}

namespace {

// A console that never blocks and holds everything: an in-memory file.
struct MemConsole {
  int out = ::memfd_create("out", MFD_CLOEXEC);
  int err = ::memfd_create("err", MFD_CLOEXEC);
  ~MemConsole() {
    ::close(out);
    ::close(err);
  }
  static std::string contents(int fd) {
    std::string s;
    char buf[65536];
    ssize_t n;
    for (off_t at = 0; (n = ::pread(fd, buf, sizeof(buf), at)) > 0; at += n) {
      s.append(buf, static_cast<std::size_t>(n));
    }
    return s;
  }
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("a long line waits whole up to the maximum, then is cut with a marker",
          "[unit][launch]") {
  MemConsole c;
  OutputPump pump(c.out, c.err, 8);
  WorkerSpec spec;
  pump.attach(spec, 0, "[w0]:", Std::none, Std::none, true, "");
  put(spec.stdout_fd, "1234");
  for (int fd : pump.fds()) pump.on_readable(fd);
  CHECK(MemConsole::contents(c.out).empty());  // not flushed mid-line
  put(spec.stdout_fd, "5678\nabcdefghijklmnopq\rxy\n");
  for (int fd : pump.fds()) pump.on_readable(fd);
  CHECK(MemConsole::contents(c.out) ==
        "[w0]:12345678\n"  // exactly the maximum: whole
        "[w0]:abcdefgh" +
            line_cut_marker(8) + "\n" + "[w0]:ijklmnop" + line_cut_marker(8) + "\n" +
            "[w0]:q\r[w0]:xy\n");
  CHECK(line_cut_marker(4194304) == "\xe2\x80\xa6[ddprun: line cut at 4194304 bytes]");
  pump.after_start();
  pump.drain();
}

TEST_CASE("1 MiB lines of two workers reach the console whole, never interleaved",
          "[unit][launch]") {
  MemConsole c;
  OutputPump pump(c.out, c.err);  // kMaxLineBytes
  WorkerSpec a, b;
  pump.attach(a, 0, "[a]:", Std::none, Std::none, true, "");
  pump.attach(b, 1, "[b]:", Std::none, Std::none, true, "");
  const std::string chunk_a(16384, 'a'), chunk_b(16384, 'b');
  const int chunks_per_line = (1 << 20) / 16384;
  for (int line = 0; line < 3; ++line) {
    for (int i = 0; i < chunks_per_line; ++i) {  // the two workers take turns, 16 KiB each
      put(a.stdout_fd, chunk_a + (i + 1 == chunks_per_line ? "\n" : ""));
      put(b.stdout_fd, chunk_b + (i + 1 == chunks_per_line ? "\n" : ""));
      for (int fd : pump.fds()) pump.on_readable(fd);
    }
  }
  pump.after_start();
  pump.drain();
  auto lines = lines_of(MemConsole::contents(c.out));
  REQUIRE(lines.size() == 6);
  for (const auto& l : lines) {
    const char ch = l.rfind("[a]:", 0) == 0 ? 'a' : 'b';
    CHECK(l.size() == 4 + (std::size_t{1} << 20));
    CHECK(l.find_first_not_of(ch, 4) == std::string::npos);
  }
  CHECK(kMaxLineBytes == std::size_t{4} << 20);
}

TEST_CASE("a log file on a full disk is named once, the console goes on", "[unit][launch]") {
  auto dir = fs::temp_directory_path() / ("ddp_full_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::create_symlink("/dev/full", dir / "stdout.log");  // every write: ENOSPC
  {
    MemConsole c;
    OutputPump pump(c.out, c.err);
    WorkerSpec spec;
    pump.attach(spec, 0, "[w0]:", Std::none, Std::out, true, dir.string());
    for (int i = 0; i < 3; ++i) {
      put(spec.stdout_fd, "line " + std::to_string(i) + "\n");
      for (int fd : pump.fds()) pump.on_readable(fd);
    }
    pump.after_start();
    pump.drain();
    CHECK(MemConsole::contents(c.out) == "[w0]:line 0\n[w0]:line 1\n[w0]:line 2\n");
    auto warnings = lines_of(MemConsole::contents(c.err));
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Catch::Contains((dir / "stdout.log").string()) &&
                                Catch::Contains("No space left on device"));
  }
  fs::remove_all(dir);
}
