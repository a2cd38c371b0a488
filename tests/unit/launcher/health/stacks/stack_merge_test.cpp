// Tests of stack_merge.hpp: signatures, collective frames, the order of the groups (the odd
// one out first; ties by "outside a collective", step, rank; missing stacks last) and the
// node's JSON for the store.
#include "ddp/launch/stack_merge.hpp"

#include <catch2/catch.hpp>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;

namespace {

// Frames given outermost first, as one reads a traceback; stored innermost first.
RankStack rank_in(int rank, std::vector<std::string> outermost_first, std::int64_t step = -1) {
  RankStack r;
  r.rank = rank;
  r.local_rank = rank % 2;
  r.node = rank < 2 ? "n0" : "n1";
  r.pid = 1000 + rank;
  r.step = step;
  r.stacks.pid = r.pid;
  r.stacks.tool = "py-spy";
  ThreadStack t;
  t.name = "MainThread";
  t.main = true;
  int line = 10;
  for (auto it = outermost_first.rbegin(); it != outermost_first.rend(); ++it) {
    t.frames.push_back({*it, "g.py", line++});
  }
  r.stacks.threads.push_back(t);
  return r;
}

RankStack no_stack(int rank) {
  RankStack r;
  r.rank = rank;
  r.pid = 1000 + rank;
  r.node = "n9";
  r.stacks.pid = r.pid;
  r.stacks.error = "py-spy: not found on PATH; eu-stack: not found on PATH";
  return r;
}

// A signature's function names, Python line numbers dropped ("train_step:10" -> "train_step").
std::vector<std::string> names(const std::vector<std::string>& sig) {
  std::vector<std::string> out;
  for (const auto& s : sig) {
    const auto colon = s.rfind(':');
    const bool line = colon != std::string::npos && colon + 1 < s.size() &&
                      s.find_first_not_of("0123456789", colon + 1) == std::string::npos;
    out.push_back(line ? s.substr(0, colon) : s);
  }
  return out;
}

const std::vector<std::string> kWaiting{"<module>", "train_step", "wrapper", "all_reduce"};
const std::vector<std::string> kSleeping{"<module>", "train_step"};

}  // namespace

TEST_CASE("stack_signature: names outermost first, no addresses or ??", "[launch][stack_merge]") {
  const std::vector<Frame> innermost_first{{"clock_nanosleep", "", 0},    {"??", "", 0},
                                           {"0x00005591abf1d17a", "", 0}, {"", "", 0},
                                           {"inner", "c.c", 4},           {"main", "c.c", 9}};
  CHECK(stack_signature(innermost_first) ==
        std::vector<std::string>{"main:9", "inner:4", "clock_nanosleep"});
  CHECK(stack_signature({}).empty());
  // A Python frame's line tells two places in one function apart; the same line is the same.
  CHECK(stack_signature({{"f", "a.py", 1}}) != stack_signature({{"f", "a.py", 2}}));
  CHECK(stack_signature({{"f", "a.py", 2}}) == stack_signature({{"f", "a.py", 2}}));
  CHECK(stack_signature({{"<module>", "a.py", 1}}) == std::vector<std::string>{"<module>:1"});
  // Native frames (no file) are grouped by function alone.
  CHECK(stack_signature({{"futex_wait", "", 0}}) == std::vector<std::string>{"futex_wait"});
}

TEST_CASE("is_collective_frame: torch, gloo, NCCL and ddp-train's names", "[launch][stack_merge]") {
  for (const char* f :
       {"all_reduce",
        "barrier",
        "broadcast",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "monitored_barrier",
        "c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)",
        "c10d::ProcessGroupNCCL::WorkNCCL::wait",
        "ncclAllReduce",
        "gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long>)",
        "gloo::(anonymous namespace)::allreduce(gloo::AllreduceOptions const&)",
        "ddp::worker::(anonymous namespace)::GlooCommunicator::all_reduce_sum(float*, unsigned "
        "long)",
        "ddp::worker::(anonymous namespace)::ShmCommunicator::arrive_and_wait(char const*, "
        "unsigned long)",
        "ddp::worker::(anonymous namespace)::NcclCommunicator::wait_stream(char const*)",
        "recv",
        "ALLREDUCE",
        "_store_based_barrier",
        "c10d::ProcessGroupNCCL::WorkNCCL::synchronize()",
        "ddp::train::GradReducer::finish()",
        "allreduce"}) {
    INFO(f);
    CHECK(is_collective_frame(f));
  }
  for (const char* f : {"train_step", "<module>", "clock_nanosleep", "time_sleep", "Event.wait",
                        "pthread_cond_wait", "_PyEval_EvalFrameDefault", "socket.send", "main",
                        "sendmsg", "recvfrom", "injected_hang_before_allreduce",
                        "ddp::train::injected_hang_before_allreduce(std::ostream&, int, long, int)",
                        "c10d::ProcessGroupGloo::runLoop(int)", "pthread_barrier_wait",
                        "foo(gloo::AllreduceOptions const&)", "compute", ""}) {
    INFO(f);
    CHECK_FALSE(is_collective_frame(f));
  }
}

TEST_CASE("merge: 1 against 3, the one first", "[launch][stack_merge]") {
  const auto g = merge_stacks({rank_in(0, kWaiting, 3), rank_in(1, kSleeping, 3),
                               rank_in(2, kWaiting, 3), rank_in(3, kWaiting, 3)});
  REQUIRE(g.size() == 2);
  CHECK(g[0].ranks == std::vector<int>{1});
  CHECK(names(g[0].signature) == kSleeping);
  CHECK_FALSE(g[0].in_collective);
  CHECK(g[0].min_step == 3);
  CHECK(g[1].ranks == std::vector<int>{0, 2, 3});
  CHECK(g[1].in_collective);
  CHECK(names(g[1].signature) == kWaiting);
}

TEST_CASE("merge: size decides before the collective", "[launch][stack_merge]") {
  // 1 rank inside all_reduce, 3 outside: the lone one is still the odd one out.
  const auto g = merge_stacks(
      {rank_in(0, kSleeping), rank_in(1, kSleeping), rank_in(2, kWaiting), rank_in(3, kSleeping)});
  REQUIRE(g.size() == 2);
  CHECK(g[0].ranks == std::vector<int>{2});
  CHECK(g[0].in_collective);
}

TEST_CASE("merge: 2 against 2, ties broken", "[launch][stack_merge]") {
  SECTION("the group outside any collective first") {
    const auto g = merge_stacks(
        {rank_in(0, kWaiting), rank_in(1, kWaiting), rank_in(2, kSleeping), rank_in(3, kSleeping)});
    REQUIRE(g.size() == 2);
    CHECK(g[0].ranks == std::vector<int>{2, 3});
    CHECK(g[1].ranks == std::vector<int>{0, 1});
  }
  SECTION("both outside: the lower step first") {
    const std::vector<std::string> other{"<module>", "load_batch"};
    const auto g = merge_stacks({rank_in(0, kSleeping, 7), rank_in(1, kSleeping, 8),
                                 rank_in(2, other, 5), rank_in(3, other, 9)});
    REQUIRE(g.size() == 2);
    CHECK(g[0].ranks == std::vector<int>{2, 3});
    CHECK(g[0].min_step == 5);
    CHECK(g[1].min_step == 7);
  }
  SECTION("an unknown step after a known one") {
    const std::vector<std::string> other{"<module>", "load_batch"};
    const auto g = merge_stacks(
        {rank_in(0, kSleeping), rank_in(1, kSleeping), rank_in(2, other, 9), rank_in(3, other)});
    REQUIRE(g.size() == 2);
    CHECK(g[0].ranks == std::vector<int>{2, 3});
    CHECK(g[1].min_step == -1);
  }
  SECTION("everything equal: the lower rank first") {
    const std::vector<std::string> other{"<module>", "load_batch"};
    const auto g = merge_stacks(
        {rank_in(3, kSleeping), rank_in(1, other), rank_in(0, kSleeping), rank_in(2, other)});
    REQUIRE(g.size() == 2);
    CHECK(g[0].ranks == std::vector<int>{0, 3});
    CHECK(g[1].ranks == std::vector<int>{1, 2});
  }
  SECTION("two ranks, one in all_reduce (the gloo script)") {
    const auto g = merge_stacks({rank_in(0, kWaiting, 3), rank_in(1, kSleeping, 3)});
    REQUIRE(g.size() == 2);
    CHECK(g[0].ranks == std::vector<int>{1});
    CHECK(g[1].ranks == std::vector<int>{0});
  }
}

TEST_CASE("merge: a phase in a collective counts as a collective frame", "[launch][stack_merge]") {
  // ddp-train: the waiting rank's main thread sits on a condition variable (no collective
  // name), but reports the allreduce phase; the hung rank computes.
  const std::vector<std::string> waiting{"main", "ddp::train::Run::step",
                                         "std::condition_variable::wait"};
  const std::vector<std::string> hung{"main", "ddp::train::Run::step",
                                      "ddp::train::injected_hang_before_allreduce", "nanosleep"};
  auto r0 = rank_in(0, waiting, 4), r1 = rank_in(1, hung, 4);
  r0.phase = "allreduce";
  r1.phase = "compute";
  auto g = merge_stacks({r0, r1});
  REQUIRE(g.size() == 2);
  CHECK(g[0].ranks == std::vector<int>{1});
  CHECK_FALSE(g[0].in_collective);
  CHECK(g[1].in_collective);
  // Without phases, nothing tells them apart but the rank.
  r0.phase.clear();
  r1.phase.clear();
  g = merge_stacks({r0, r1});
  CHECK(g[0].ranks == std::vector<int>{0});
  CHECK_FALSE(g[0].in_collective);
}

TEST_CASE("merge: all identical, one group, none, no group", "[launch][stack_merge]") {
  const auto g = merge_stacks({rank_in(2, kWaiting), rank_in(0, kWaiting), rank_in(1, kWaiting)});
  REQUIRE(g.size() == 1);
  CHECK(g[0].ranks == std::vector<int>{0, 1, 2});
  CHECK(g[0].in_collective);
  CHECK(merge_stacks({}).empty());
}

TEST_CASE("merge: ranks without a stack form the last group", "[launch][stack_merge]") {
  const auto g = merge_stacks({no_stack(0), rank_in(1, kWaiting), rank_in(2, kWaiting),
                               rank_in(3, kSleeping), no_stack(4)});
  REQUIRE(g.size() == 3);
  CHECK(g[0].ranks == std::vector<int>{3});
  CHECK(g[1].ranks == std::vector<int>{1, 2});
  CHECK(g[2].ranks == std::vector<int>{0, 4});
  CHECK(g[2].signature.empty());
  CHECK_FALSE(g[2].in_collective);
  // Only ranks of addresses ("??") count as no stack as well.
  RankStack unknown = rank_in(5, {"??", "0x1234"});
  const auto h = merge_stacks({unknown, rank_in(6, kSleeping), rank_in(7, kSleeping)});
  REQUIRE(h.size() == 2);
  CHECK(h[0].ranks == std::vector<int>{6, 7});
  CHECK(h[1].ranks == std::vector<int>{5});
}

TEST_CASE("rank stacks JSON: round trip and errors", "[launch][stack_merge]") {
  std::vector<RankStack> in{rank_in(0, kWaiting, 3), rank_in(3, kSleeping), no_stack(5)};
  in[0].phase = "allreduce";
  const auto out = rank_stacks_from_json(rank_stacks_to_json(in));
  REQUIRE(out.size() == 3);
  for (std::size_t i = 0; i < in.size(); ++i) {
    CHECK(out[i].rank == in[i].rank);
    CHECK(out[i].local_rank == in[i].local_rank);
    CHECK(out[i].node == in[i].node);
    CHECK(out[i].pid == in[i].pid);
    CHECK(out[i].step == in[i].step);
    CHECK(out[i].phase == in[i].phase);
    CHECK(out[i].stacks.tool == in[i].stacks.tool);
    CHECK(out[i].stacks.error == in[i].stacks.error);
    CHECK(stack_signature(main_frames(out[i].stacks)) ==
          stack_signature(main_frames(in[i].stacks)));
  }
  CHECK(main_frames(out[0].stacks)[0].line == main_frames(in[0].stacks)[0].line);
  CHECK(merge_stacks(out).size() == 3);
  CHECK(rank_stacks_from_json("[]").empty());
  CHECK_THROWS_AS(rank_stacks_from_json("{"), ddp::ProtocolError);
  CHECK_THROWS_AS(rank_stacks_from_json(R"([{"rank":1}])"), ddp::ProtocolError);
  CHECK_THROWS_AS(rank_stacks_from_json(R"([{"rank":"1","local_rank":0,"pid":3,"stacks":{}}])"),
                  ddp::ProtocolError);
  CHECK_THROWS_AS(rank_stacks_from_json(R"([{"rank":1,"local_rank":0,"pid":3}])"),
                  ddp::ProtocolError);
  CHECK_THROWS_AS(rank_stacks_from_json(R"([{"rank":1,"local_rank":0,"pid":3,"stacks":{}}])"),
                  ddp::ProtocolError);  // a process without its pid
}

TEST_CASE("merge: when only some ranks stalled, their group comes first", "[launch][stack_merge]") {
  // Rank 2 stopped; the others still step (in a different place each time): progress says who.
  auto a = rank_in(0, kSleeping, 9);
  auto b = rank_in(1, kSleeping, 9);
  auto c = rank_in(2, kWaiting, 3);
  c.stalled = true;
  auto d = rank_in(3, kSleeping, 9);
  const auto g = merge_stacks({a, b, c, d});
  REQUIRE(g.size() == 2);
  CHECK(g[0].ranks == std::vector<int>{2});
  CHECK(g[0].stalled);
  // Every rank stalled: no information in that, the odd stack decides.
  for (auto* r : {&a, &b, &d}) r->stalled = true;
  const auto all = merge_stacks({a, b, c, d});
  CHECK(all[0].ranks == std::vector<int>{2});  // still the lone one, by size
  c.stalled = false;
  a.stalled = b.stalled = d.stalled = false;
  // A stalled rank in the same stack as progressing ones is a group of its own, first.
  auto e = rank_in(4, kSleeping, 9);
  auto f = rank_in(5, kSleeping, 9);
  a.stalled = true;
  const auto part = merge_stacks({a, e, f});
  REQUIRE(part.size() == 2);
  CHECK(part[0].ranks == std::vector<int>{0});
  CHECK(part[1].ranks == std::vector<int>{4, 5});
}
