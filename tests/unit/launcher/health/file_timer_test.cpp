// Tests of file_timer.hpp: the request parser against the exact lines torch 2.15's
// FileTimerClient writes, the timer table's semantics (torch's FileTimerServer.register_timers,
// get_expired_timers, clear_timers), and the FIFO itself: plain writes, then torch's real
// client from the test venv (skipped, with a warning, when the venv is missing).
#include <catch2/catch.hpp>
#include "support/skip.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "ddp/launch/file_timer.hpp"
#include "ddp/proto/error.hpp"

using namespace ddp::launch;
namespace fs = std::filesystem;

namespace {

// Written by torch 2.15's FileTimerClient (captured from the venv): `expires(after=5)` (its
// default scope is contextlib's frame), `expires(after=5, scope="step")`, and
// FileTimerClient(path, signal=15).acquire("x", ...) / release("x").
const char* kAcquireDefaultScope =
    R"({"version": 1, "pid": 15230, "scope_id": "/root/.pyenv/versions/3.11.7/lib/python3.11/contextlib.py#137", "expiration_time": 1795606856.657974, "signal": 9})";
const char* kReleaseDefaultScope =
    R"({"version": 1, "pid": 15230, "scope_id": "/root/.pyenv/versions/3.11.7/lib/python3.11/contextlib.py#137", "expiration_time": -1, "signal": 0})";
const char* kAcquireStep =
    R"({"version": 1, "pid": 15230, "scope_id": "step", "expiration_time": 1795606856.6581202, "signal": 9})";
const char* kReleaseStep =
    R"({"version": 1, "pid": 15230, "scope_id": "step", "expiration_time": -1, "signal": 0})";
const char* kAcquireSigterm =
    R"({"version": 1, "pid": 15230, "scope_id": "x", "expiration_time": 1795605189.328824, "signal": 15})";
const char* kReleaseSigterm =
    R"({"version": 1, "pid": 15230, "scope_id": "x", "expiration_time": -1, "signal": 0})";

TimerRequest req(pid_t pid, std::string scope, double exp, int sig = 9) {
  TimerRequest r;
  r.pid = pid;
  r.scope_id = std::move(scope);
  r.expiration_time = exp;
  r.signal = sig;
  return r;
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/ddp_file_timer_test_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// One writer, as torch's client does it: open non-blocking, one write, close.
void write_fifo(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

std::unique_ptr<FileTimerServer> server_at(const fs::path& fifo) {
  auto s = FileTimerServer::from_env(
      {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", fifo.string()}});
  REQUIRE(s != nullptr);
  return s;
}

std::string venv_python() {
#ifdef DDP_TORCH2_PYTHON
  return DDP_TORCH2_PYTHON;
#else
  const char* home = ::getenv("HOME");
  return home ? std::string(home) + "/.cache/ddprun/torch-venv/bin/python" : std::string();
#endif
}

}  // namespace

TEST_CASE("file timer: torch's client lines parse to the request it meant", "[unit][file_timer]") {
  std::string err;
  auto a = parse_timer_request(kAcquireDefaultScope, &err);
  REQUIRE(a);
  CHECK(a->pid == 15230);
  CHECK(a->scope_id == "/root/.pyenv/versions/3.11.7/lib/python3.11/contextlib.py#137");
  CHECK(a->expiration_time == Approx(1795606856.657974).epsilon(1e-15));
  CHECK(a->signal == 9);

  auto rel = parse_timer_request(kReleaseDefaultScope, &err);
  REQUIRE(rel);
  CHECK(rel->expiration_time == -1);
  CHECK(rel->signal == 0);
  CHECK(rel->scope_id == a->scope_id);

  auto t = parse_timer_request(kAcquireSigterm, &err);
  REQUIRE(t);
  CHECK(t->scope_id == "x");
  CHECK(t->signal == 15);
  REQUIRE(parse_timer_request(kAcquireStep, &err));
  REQUIRE(parse_timer_request(kReleaseStep, &err));

  // torch's server reads only these four fields: no version and extra fields are fine.
  auto bare = parse_timer_request(
      R"({"pid": 7, "scope_id": "", "expiration_time": 5, "signal": -3, "x": 1})", &err);
  REQUIRE(bare);
  CHECK(bare->pid == 7);
  CHECK(bare->scope_id.empty());
  CHECK(bare->expiration_time == 5.0);
  CHECK(bare->signal == -3);  // <= 0: expires without a signal
}

TEST_CASE("file timer: other lines are refused with the reason", "[unit][file_timer]") {
  auto refused = [](const std::string& line) {
    std::string err;
    INFO(line);
    CHECK_FALSE(parse_timer_request(line, &err));
    return err;
  };
  CHECK_THAT(refused("step=3"), Catch::Contains("not JSON"));
  CHECK_THAT(refused(R"([1, 2])"), Catch::Contains("not a JSON object"));
  CHECK_THAT(
      refused(R"({"version": 2, "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9})"),
      Catch::Contains("version 2 is not 1"));
  CHECK_THAT(refused(R"({"version": 1, "scope_id": "s", "expiration_time": 1, "signal": 9})"),
             Catch::Contains("no \"pid\""));
  for (const char* pid :
       {"0", "-1", "true", "1.5", "\"12\"", "4294967297", "18446744073709551615"}) {
    auto line = std::string(R"({"pid": )") + pid +
                R"(, "scope_id": "s", "expiration_time": 1, "signal": 9})";
    CHECK_THAT(refused(line), Catch::Contains("is not a process id"));
  }
  CHECK_THAT(refused(R"({"pid": 5, "scope_id": 3, "expiration_time": 1, "signal": 9})"),
             Catch::Contains("\"scope_id\" 3 is not a string"));
  CHECK_THAT(refused(R"({"pid": 5, "scope_id": "s", "signal": 9})"),
             Catch::Contains("no \"expiration_time\""));
  CHECK_THAT(refused(R"({"pid": 5, "scope_id": "s", "expiration_time": "soon", "signal": 9})"),
             Catch::Contains("is not a number of seconds"));
  CHECK_THAT(refused(R"({"pid": 5, "scope_id": "s", "expiration_time": 1})"),
             Catch::Contains("no \"signal\""));
  for (const char* sig : {"65", "9.0", "\"KILL\"", "18446744073709551615"}) {
    auto line =
        std::string(R"({"pid": 5, "scope_id": "s", "expiration_time": 1, "signal": )") + sig + "}";
    CHECK_THAT(refused(line), Catch::Contains("is not a signal number"));
  }
  // The message quotes the line, cut short.
  const auto err = refused(std::string(500, 'z'));
  CHECK_THAT(err, Catch::StartsWith("file timer request 'zzz"));
  CHECK(err.size() < 400);
}

TEST_CASE("file timer: the table keeps one timer per pid and scope", "[unit][file_timer]") {
  TimerTable t;
  CHECK_FALSE(t.next_deadline());
  t.apply(req(10, "step", 100.0));
  t.apply(req(10, "ckpt", 300.0));
  t.apply(req(20, "step", 200.0));
  CHECK(t.size() == 3);
  CHECK(t.pids() == std::vector<pid_t>{10, 20});
  CHECK(*t.next_deadline() == 100.0);

  t.apply(req(10, "step", 250.0, 15));  // re-acquire the same scope: replaces it
  CHECK(t.size() == 3);
  CHECK(*t.next_deadline() == 200.0);

  t.apply(req(20, "step", -1, 0));   // release
  t.apply(req(20, "never", -1, 0));  // release of nothing: no-op
  CHECK(t.size() == 2);
  CHECK(t.pids() == std::vector<pid_t>{10});
  CHECK(*t.next_deadline() == 250.0);

  CHECK(t.take_expired(249.9).empty());
  auto e = t.take_expired(250.0);  // <= now expires
  REQUIRE(e.size() == 1);
  CHECK(e[0].pid == 10);
  CHECK(e[0].scope_id == "step");
  CHECK(e[0].signal == 15);
  CHECK(t.size() == 1);
  CHECK(t.take_expired(250.0).empty());  // taken once

  t.forget_pid(10);
  CHECK(t.size() == 0);
  CHECK_FALSE(t.next_deadline());
}

TEST_CASE("file timer: expired timers come out by expiration time", "[unit][file_timer]") {
  TimerTable t;
  t.apply(req(30, "a", 5.0));
  t.apply(req(10, "b", 7.0));
  t.apply(req(20, "c", 3.0, 0));
  t.apply(req(10, "a", 3.0));
  t.apply(req(40, "late", 50.0));
  auto e = t.take_expired(10.0);
  REQUIRE(e.size() == 4);
  CHECK((e[0].pid == 10 && e[0].scope_id == "a"));  // ties by (pid, scope)
  CHECK((e[1].pid == 20 && e[1].signal == 0));
  CHECK(e[2].pid == 30);
  CHECK((e[3].pid == 10 && e[3].scope_id == "b"));
  CHECK(t.size() == 1);
  t.forget_pid(99);  // unknown pid: no-op
  CHECK(t.size() == 1);
}

TEST_CASE("file timer: only TORCHELASTIC_ENABLE_FILE_TIMER=1 starts it", "[unit][file_timer]") {
  TempDir dir;
  const auto fifo = (dir.path / "t").string();
  CHECK(FileTimerServer::from_env({{"TORCHELASTIC_TIMER_FILE", fifo}}) == nullptr);
  for (const char* v : {"0", "true", "", " 1"}) {
    CHECK(FileTimerServer::from_env({{"TORCHELASTIC_ENABLE_FILE_TIMER", v},
                                     {"TORCHELASTIC_TIMER_FILE", fifo}}) == nullptr);
  }
  CHECK_FALSE(fs::exists(fifo));
  CHECK_THROWS_AS(FileTimerServer::from_env(
                      {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", ""}}),
                  ddp::ConfigError);
  CHECK_THROWS_AS(FileTimerServer::from_env({{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"},
                                             {"TORCHELASTIC_TIMER_FILE", fifo + "/no/dir"}}),
                  ddp::IoError);
}

TEST_CASE("file timer: a fresh FIFO in TMPDIR named as torch's", "[unit][file_timer]") {
  TempDir dir;
  std::string path;
  {
    auto s = FileTimerServer::from_env(
        {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TMPDIR", dir.path.string() + "/"}});
    REQUIRE(s);
    path = s->path();
    const fs::path p(path);
    CHECK(p.parent_path() == dir.path);
    // watchdog_timer_<uuid4>, checked by hand: std::regex trips GCC 12's
    // -Wmaybe-uninitialized under the sanitizers.
    const std::string name = p.filename().string();
    const std::string prefix = "watchdog_timer_";
    REQUIRE(name.size() == prefix.size() + 36);
    CHECK(name.compare(0, prefix.size(), prefix) == 0);
    const std::string uuid = name.substr(prefix.size());
    for (std::size_t i = 0; i < uuid.size(); ++i) {
      INFO(uuid);
      if (i == 8 || i == 13 || i == 18 || i == 23) {
        CHECK(uuid[i] == '-');
      } else {
        CHECK(std::string("0123456789abcdef").find(uuid[i]) != std::string::npos);
      }
    }
    CHECK(uuid[14] == '4');
    CHECK(std::string("89ab").find(uuid[19]) != std::string::npos);
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));
    CHECK((st.st_mode & 0777) == 0600);
  }
  CHECK_FALSE(fs::exists(path));  // removed with the server
}

TEST_CASE("file timer: lines written into the FIFO reach the table", "[unit][file_timer]") {
  TempDir dir;
  const auto fifo = dir.path / "timer";
  {
    FILE* f = ::fopen(fifo.c_str(), "w");
    REQUIRE(f);
    ::fclose(f);
  }  // torch removes it first
  auto s = server_at(fifo);
  CHECK(s->path() == fifo.string());
  struct stat st {};
  REQUIRE(::stat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK(s->on_readable().empty());  // nothing yet: EAGAIN, not EOF
  CHECK(s->timeout_ms(0) == -1);

  write_fifo(fifo, std::string(kAcquireStep) + "\n" + kAcquireSigterm + "\n");
  auto got = s->on_readable();
  REQUIRE(got.size() == 2);
  CHECK(got[0].scope_id == "step");
  CHECK(got[1].signal == 15);
  CHECK(s->table().size() == 2);
  CHECK(s->timeout_ms(1795605189.328824 - 1.0001) == 1001);  // rounds up
  CHECK(s->timeout_ms(1795605189.328824 + 5) == 0);

  // A line split across writers' writes, a blank line, a bad one, then the release.
  const std::string release = kReleaseStep;
  write_fifo(fifo, release.substr(0, 20));
  CHECK(s->on_readable().empty());
  write_fifo(fifo, release.substr(20) + "\n\n{oops}\n");
  got = s->on_readable();
  REQUIRE(got.size() == 1);
  CHECK(got[0].expiration_time < 0);
  CHECK(s->table().size() == 1);
  auto errors = s->take_errors();
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::Contains("'{oops}': not JSON"));
  CHECK(s->take_errors().empty());

  // A line over the bound is dropped whole (over several reads), and the next line parses.
  write_fifo(fifo, std::string(40000, 'y'));
  CHECK(s->on_readable().empty());
  CHECK(s->take_errors().empty());
  write_fifo(fifo, std::string(40000, 'y'));
  CHECK(s->on_readable().empty());
  write_fifo(fifo, std::string(5000, 'y') + "\n" + kReleaseSigterm + "\n");
  got = s->on_readable();
  REQUIRE(got.size() == 1);
  CHECK(got[0].scope_id == "x");
  CHECK(s->table().size() == 0);
  errors = s->take_errors();
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::Contains("dropped a line longer than 65536 bytes"));

  auto expired = s->take_expired(1e12);
  CHECK(expired.empty());
}

TEST_CASE("file timer: torch's own FileTimerClient talks to the server", "[unit][file_timer]") {
  const auto python = venv_python();
  if (python.empty() || ::access(python.c_str(), X_OK) != 0) {
    DDP_SKIP_TOOL("the torch venv's python at '" << python << "' (scripts/setup.sh --with-torch)");
  }
  TempDir dir;
  const auto fifo = dir.path / "watchdog";
  auto s = server_at(fifo);
  // As a worker would: the path from TORCHELASTIC_TIMER_FILE, expires() with the default
  // SIGKILL client, then a SIGTERM client whose timer is left held.
  const std::string script =
      "import os\n"
      "from torch.distributed.elastic.timer import FileTimerClient, configure, expires\n"
      "configure(FileTimerClient(os.environ['TORCHELASTIC_TIMER_FILE']))\n"
      "with expires(after=60, scope='step'):\n"
      "    pass\n"
      "FileTimerClient(os.environ['TORCHELASTIC_TIMER_FILE'], signal=15).acquire('held', "
      "4102444800.5)\n"
      "print(os.getpid(), flush=True)\n";
  const auto script_path = dir.path / "client.py";
  {
    FILE* f = ::fopen(script_path.c_str(), "w");
    REQUIRE(f);
    REQUIRE(::fwrite(script.data(), 1, script.size(), f) == script.size());
    ::fclose(f);
  }
  const std::string cmd = "TORCHELASTIC_TIMER_FILE='" + fifo.string() + "' timeout 120 '" + python +
                          "' '" + script_path.string() + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[4096];
  for (size_t n; (n = ::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  INFO("client output: " << out);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const pid_t pid = static_cast<pid_t>(std::stol(out));

  const auto got = s->on_readable();
  CHECK(s->take_errors().empty());
  REQUIRE(got.size() == 3);
  for (const auto& r : got) CHECK(r.pid == pid);
  CHECK(got[0].scope_id == "step");
  CHECK(got[0].signal == 9);
  CHECK(got[0].expiration_time > 1.7e9);
  CHECK(got[1].scope_id == "step");
  CHECK(got[1].expiration_time < 0);
  CHECK(got[1].signal == 0);
  CHECK(got[2].scope_id == "held");
  CHECK(got[2].expiration_time == 4102444800.5);
  CHECK(got[2].signal == 15);
  REQUIRE(s->table().size() == 1);
  CHECK(*s->table().next_deadline() == 4102444800.5);

  s->forget_dead_pids();  // the client has exited (pclose reaped it)
  CHECK(s->table().size() == 0);
}
