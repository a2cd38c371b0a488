// Tests of stacks.hpp: py-spy's --json and eu-stack's text as the tools print them (outputs
// captured from py-spy 0.4.3 and elfutils 0.188 on Debian 12), the main thread found, and the
// store's compact JSON with its caps.
#include "ddp/launch/stacks.hpp"

#include <catch2/catch.hpp>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;

namespace {

// `py-spy dump --pid P --json` of a python 3.11 process whose main thread sleeps in
// stuck_here() and a thread "bg" that sleeps in a lambda (threads come unordered: bg first).
const char* kPySpy = R"([{"pid": 14633, "thread_id": 139697280534208, "thread_name": "bg",
"os_thread_id": 14635, "active": false, "owns_gil": false, "frames": [
{"name": "<lambda>", "filename": "/tmp/h17s/sl.py", "module": null, "short_filename": "sl.py",
 "line": 6, "locals": null, "is_entry": true, "is_shim_entry": false},
{"name": "Thread.run", "filename": "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py",
 "module": null, "short_filename": "threading.py", "line": 982, "locals": null,
 "is_entry": false, "is_shim_entry": false},
{"name": "Thread._bootstrap_inner",
 "filename": "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", "module": null,
 "short_filename": "threading.py", "line": 1045, "locals": null, "is_entry": false,
 "is_shim_entry": false},
{"name": "Thread._bootstrap",
 "filename": "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", "module": null,
 "short_filename": "threading.py", "line": 1002, "locals": null, "is_entry": true,
 "is_shim_entry": true}], "process_info": null},
{"pid": 14633, "thread_id": 139697292319616, "thread_name": "MainThread",
"os_thread_id": 14633, "active": false, "owns_gil": false, "frames": [
{"name": "stuck_here", "filename": "/tmp/h17s/sl.py", "module": null,
 "short_filename": "sl.py", "line": 3, "locals": null, "is_entry": false,
 "is_shim_entry": false},
{"name": "outer", "filename": "/tmp/h17s/sl.py", "module": null, "short_filename": "sl.py",
 "line": 5, "locals": null, "is_entry": false, "is_shim_entry": false},
{"name": "<module>", "filename": "/tmp/h17s/sl.py", "module": null, "short_filename": "sl.py",
 "line": 7, "locals": null, "is_entry": true, "is_shim_entry": true}],
"process_info": null}])";

// `eu-stack -p P` of a C program: main -> outer -> inner -> sleep, and a thread in pause().
const char* kEuStackC = R"(PID 17565 - process
TID 17565:
#0  0x00007fc429d8f545 clock_nanosleep@GLIBC_2.2.5
#1  0x00007fc429d93e53 __nanosleep
#2  0x00007fc429d93d8a sleep
#3  0x00005591abf1d17a inner
#4  0x00005591abf1d186 outer
#5  0x00005591abf1d1b3 main
#6  0x00007fc429ce724a __libc_start_call_main
#7  0x00007fc429ce7305 __libc_start_main@@GLIBC_2.34
#8  0x00005591abf1d091 _start
TID 17566:
#0  0x00007fc429d93df2 pause
#1  0x00005591abf1d16a th
#2  0x00007fc429d491f5 start_thread
#3  0x00007fc429dc98ec __clone3
)";

// `eu-stack -p P` of coreutils' sleep (stripped: frames with an address only).
const char* kEuStackSleep = R"(PID 14920 - process
TID 14920:
#0  0x00007f14f0248503 clock_nanosleep@GLIBC_2.2.5
#1  0x00007f14f024ce53 __nanosleep
#2  0x0000555ad35ff4af
#3  0x0000555ad35fef81
#4  0x0000555ad35fb558
#5  0x00007f14f01a024a __libc_start_call_main
#6  0x00007f14f01a0305 __libc_start_main@@GLIBC_2.34
#7  0x0000555ad35fb621
)";

ProcessStacks process_with(int threads, int frames, int main_at) {
  ProcessStacks p;
  p.pid = 42;
  p.tool = "eu-stack";
  for (int t = 0; t < threads; ++t) {
    ThreadStack ts;
    ts.name = "t" + std::to_string(t);
    ts.main = t == main_at;
    for (int f = 0; f < frames; ++f) ts.frames.push_back({"f" + std::to_string(f), "", 0});
    p.threads.push_back(ts);
  }
  return p;
}

}  // namespace

TEST_CASE("py-spy --json: threads, frames innermost first, MainThread first", "[launch][stacks]") {
  const auto threads = parse_py_spy_json(kPySpy);
  REQUIRE(threads.size() == 2);
  CHECK(threads[0].name == "MainThread");
  CHECK(threads[0].main);
  CHECK_FALSE(threads[1].main);
  CHECK(threads[1].name == "bg");
  REQUIRE(threads[0].frames.size() == 3);
  CHECK(threads[0].frames[0].function == "stuck_here");
  CHECK(threads[0].frames[0].file == "sl.py");
  CHECK(threads[0].frames[0].line == 3);
  CHECK(threads[0].frames[2].function == "<module>");
  CHECK(threads[1].frames[1].function == "Thread.run");
  CHECK(threads[1].frames[1].file == "threading.py");
}

TEST_CASE("py-spy --json: main thread by tid == pid, else the first", "[launch][stacks]") {
  // A renamed main thread: os_thread_id == pid decides.
  auto t = parse_py_spy_json(
      R"([{"pid":7,"thread_name":"worker","os_thread_id":8,"frames":[{"name":"a","line":1}]},
          {"pid":7,"thread_name":"renamed","os_thread_id":7,"frames":[{"name":"b","line":2}]}])");
  REQUIRE(t.size() == 2);
  CHECK(t[0].name == "renamed");
  CHECK(t[0].main);
  CHECK_FALSE(t[1].main);
  // No tid, no MainThread: the first thread.
  t = parse_py_spy_json(R"([{"thread_name":null,"frames":[]},{"thread_name":"x","frames":[]}])");
  REQUIRE(t.size() == 2);
  CHECK(t[0].main);
  CHECK(t[0].name == "thread -1");
  CHECK(parse_py_spy_json("[]").empty());
}

TEST_CASE("py-spy --json: what is not its JSON throws ProtocolError", "[launch][stacks]") {
  CHECK_THROWS_AS(parse_py_spy_json("Error: Failed to find python version from target process"),
                  ddp::ProtocolError);
  CHECK_THROWS_AS(parse_py_spy_json(R"({"pid": 1})"), ddp::ProtocolError);
  CHECK_THROWS_AS(parse_py_spy_json(R"([1, 2])"), ddp::ProtocolError);
  CHECK_THROWS_AS(parse_py_spy_json(R"([{"frames": 3}])"), ddp::ProtocolError);
  CHECK_THROWS_AS(parse_py_spy_json(R"([{"frames": [7]}])"), ddp::ProtocolError);
}

TEST_CASE("eu-stack: TID blocks, tid == pid is main, symbol versions dropped", "[launch][stacks]") {
  const auto t = parse_eu_stack(kEuStackC, 17565);
  REQUIRE(t.size() == 2);
  CHECK(t[0].main);
  CHECK(t[0].name == "TID 17565");
  REQUIRE(t[0].frames.size() == 9);
  CHECK(t[0].frames[0].function == "clock_nanosleep");
  CHECK(t[0].frames[0].file.empty());
  CHECK(t[0].frames[0].line == 0);
  CHECK(t[0].frames[3].function == "inner");
  CHECK(t[0].frames[7].function == "__libc_start_main");
  CHECK_FALSE(t[1].main);
  REQUIRE(t[1].frames.size() == 4);
  CHECK(t[1].frames[0].function == "pause");
  CHECK(t[1].frames[3].function == "__clone3");
}

TEST_CASE("eu-stack: frames with an address only, pid not among the TIDs", "[launch][stacks]") {
  auto t = parse_eu_stack(kEuStackSleep, 14920);
  REQUIRE(t.size() == 1);
  REQUIRE(t[0].frames.size() == 8);
  CHECK(t[0].frames[1].function == "__nanosleep");
  CHECK(t[0].frames[2].function == "??");
  // A pid of none of the threads: the first thread stands for the main one.
  t = parse_eu_stack(kEuStackC, 1);
  REQUIRE(t.size() == 2);
  CHECK(t[0].main);
  CHECK(t[0].name == "TID 17565");
  // -s source lines, errors and an empty text are skipped, not misread.
  t = parse_eu_stack(
      "PID 5 - process\nTID 5:\n#0  0x00005591abf1d17a inner\n    /tmp/c.c:4:45\n"
      "eu-stack: dwfl_thread_getframes tid 6: No DWARF information found\n",
      5);
  REQUIRE(t.size() == 1);
  REQUIRE(t[0].frames.size() == 1);
  CHECK(t[0].frames[0].function == "inner");
  CHECK(parse_eu_stack("", 5).empty());
  CHECK(parse_eu_stack("eu-stack: dwfl_linux_proc_report pid 999999: No such file", 5).empty());
}

TEST_CASE("main_frames: the main thread's, or none", "[launch][stacks]") {
  ProcessStacks p;
  CHECK(main_frames(p).empty());
  p.threads = parse_eu_stack(kEuStackC, 17565);
  REQUIRE(main_frames(p).size() == 9);
  CHECK(main_frames(p)[3].function == "inner");
  p.threads[0].main = false;
  CHECK(main_frames(p).empty());
}

TEST_CASE("stacks JSON: round trip", "[launch][stacks]") {
  std::vector<ProcessStacks> in(3);
  in[0].pid = 100;
  in[0].tool = "py-spy";
  in[0].threads = parse_py_spy_json(kPySpy);
  in[1].pid = 101;
  in[1].tool = "eu-stack";
  in[1].threads = parse_eu_stack(kEuStackC, 17565);
  in[2].pid = 102;
  in[2].error = "py-spy: not found on PATH; eu-stack: not found on PATH";
  const auto out = stacks_from_json(stacks_to_json(in));
  REQUIRE(out.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(out[i].pid == in[i].pid);
    CHECK(out[i].tool == in[i].tool);
    CHECK(out[i].error == in[i].error);
    REQUIRE(out[i].threads.size() == in[i].threads.size());
    for (std::size_t t = 0; t < in[i].threads.size(); ++t) {
      CHECK(out[i].threads[t].name == in[i].threads[t].name);
      CHECK(out[i].threads[t].main == in[i].threads[t].main);
      REQUIRE(out[i].threads[t].frames.size() == in[i].threads[t].frames.size());
      for (std::size_t f = 0; f < in[i].threads[t].frames.size(); ++f) {
        CHECK(out[i].threads[t].frames[f].function == in[i].threads[t].frames[f].function);
        CHECK(out[i].threads[t].frames[f].file == in[i].threads[t].frames[f].file);
        CHECK(out[i].threads[t].frames[f].line == in[i].threads[t].frames[f].line);
      }
    }
  }
  CHECK(stacks_from_json(stacks_to_json({})).empty());
}

TEST_CASE("stacks JSON: the main thread and 3 others, the innermost 64 frames, short names",
          "[launch][stacks]") {
  auto p = process_with(6, 100, 5);  // the main thread last
  p.threads[5].frames[0].function = std::string(5000, 'x');
  const std::string text = stacks_to_json({p});
  const auto out = stacks_from_json(text);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].threads.size() == 4);
  CHECK(out[0].threads[0].name == "t5");
  CHECK(out[0].threads[0].main);
  CHECK(out[0].threads[1].name == "t0");
  for (const auto& t : out[0].threads) {
    REQUIRE(t.frames.size() == 64);
    CHECK(t.frames[1].function == "f1");  // the innermost kept
  }
  CHECK(out[0].threads[0].frames[0].function.size() == 256);
  CHECK(text.size() < 16 * 1024);
}

TEST_CASE("stacks JSON: bad input throws ProtocolError", "[launch][stacks]") {
  CHECK_THROWS_AS(stacks_from_json("not json"), ddp::ProtocolError);
  CHECK_THROWS_AS(stacks_from_json(R"({"pid":1})"), ddp::ProtocolError);
  CHECK_THROWS_AS(stacks_from_json(R"([{"tool":"py-spy"}])"), ddp::ProtocolError);
  CHECK_THROWS_AS(stacks_from_json(R"([{"pid":1,"threads":{}}])"), ddp::ProtocolError);
  CHECK_THROWS_AS(stacks_from_json(R"([{"pid":1,"threads":[{"frames":[["f","x"]]}]}])"),
                  ddp::ProtocolError);
  CHECK_THROWS_AS(stacks_from_json(R"([{"pid":1,"threads":[{"frames":[[1,"x",2]]}]}])"),
                  ddp::ProtocolError);
}
