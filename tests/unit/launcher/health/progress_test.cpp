// Tests of progress.hpp: the line parser's edge cases (bare numbers, key=value fields in any
// order, CRLF, junk, signs, numbers past int64), apply()'s state and step durations, and the
// reader over real pipes: lines split across reads, several lines in one read, an overlong
// line dropped and counted, EOF, and the write end's flags; the control pipe the other way.
#include "ddp/launch/progress.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <optional>
#include <string>

#include "ddp/worker/progress.hpp"

using namespace ddp::launch;
using namespace std::chrono_literals;

namespace {

SteadyTime at(double s) {
  return SteadyTime{} + std::chrono::duration_cast<SteadyTime::duration>(
                            std::chrono::duration<double>(1000.0 + s));
}

ProgressLine step(std::int64_t n, std::string phase = "") {
  ProgressLine l;
  l.step = n;
  l.phase = std::move(phase);
  return l;
}

void write_all(int fd, const std::string& s) {
  REQUIRE(::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
}

}  // namespace

TEST_CASE("progress lines: bare numbers and key=value fields", "[unit][launch][progress]") {
  auto bare = parse_progress_line("12");
  REQUIRE(bare);
  CHECK(bare->step == 12);
  CHECK(bare->phase.empty());
  CHECK_FALSE(bare->t);

  auto full = parse_progress_line("step=12 phase=fwd t=1.5");
  REQUIRE(full);
  CHECK(full->step == 12);
  CHECK(full->phase == "fwd");
  REQUIRE(full->t);
  CHECK(*full->t == 1.5);

  auto reordered = parse_progress_line("t=1700000000.25\tphase=allreduce  step=0");
  REQUIRE(reordered);
  CHECK(reordered->step == 0);
  CHECK(reordered->phase == "allreduce");
  CHECK(*reordered->t == 1700000000.25);

  CHECK(parse_progress_line("step=7 rank=3 loss=0.1")->step == 7);  // unknown keys ignored
  CHECK(parse_progress_line("007")->step == 7);
  CHECK(parse_progress_line("9223372036854775807")->step == INT64_MAX);
}

TEST_CASE("progress lines: CRLF and blanks around the line", "[unit][launch][progress]") {
  CHECK(parse_progress_line("12\r")->step == 12);
  CHECK(parse_progress_line("step=3 phase=bwd\r")->phase == "bwd");
  CHECK(parse_progress_line("  step=4  ")->step == 4);
}

TEST_CASE("progress lines: junk is not progress", "[unit][launch][progress]") {
  for (const char* junk : {"",
                           "   ",
                           "\r",
                           "hello",
                           "step",
                           "step=",
                           "=3",
                           "step=abc",
                           "step=12abc",
                           "12abc",
                           "12 13",
                           "1.5",
                           "-3",
                           "step=-3",
                           "+3",
                           "step=+3",
                           "9223372036854775808",
                           "step=99999999999999999999999",
                           "phase=fwd",
                           "t=1.5",
                           "step=1 t=abc",
                           "step=1 t=-1",
                           "step=1 t=nan",
                           "step=1 t=inf",
                           "step=1 t=1e999",
                           "step=1 phase=",
                           "step=1 =x",
                           "step=1 phase=f\x01o",
                           "step=1 step=2",
                           "step=1 phase=a phase=b",
                           "step=1 t=1 t=2",
                           "step=1 junk",
                           "0x10",
                           "step=0x10",
                           "step=1\rstep=2"}) {
    INFO("line: '" << junk << "'");
    CHECK_FALSE(parse_progress_line(junk));
  }
  CHECK_FALSE(parse_progress_line("step=1 phase=" + std::string(65, 'a')));
  CHECK(parse_progress_line("step=1 phase=" + std::string(64, 'a')));
}

TEST_CASE("apply: first step, step durations, phases, a counter going back",
          "[unit][launch][progress]") {
  RankProgress r;
  r.last_change = at(0);  // spawn
  r.step_change = at(0);
  ProgressReader::apply(r, step(5, "fwd"), at(30));  // startup is not a step
  CHECK(r.reported);
  CHECK(r.step == 5);
  CHECK(r.phase == "fwd");
  CHECK(r.last_change == at(30));
  CHECK(r.step_s.empty());

  ProgressReader::apply(r, step(5, "bwd"), at(31));  // a phase change is progress, not a step
  CHECK(r.phase == "bwd");
  CHECK(r.last_change == at(31));
  CHECK(r.step_s.empty());

  ProgressReader::apply(r, step(5, "bwd"), at(35));  // a repeat is not progress
  CHECK(r.last_change == at(31));

  ProgressReader::apply(r, step(6, "fwd"), at(32));  // measured from the step change at 30
  REQUIRE(r.step_s.size() == 1);
  CHECK(r.step_s[0] == Approx(2.0));

  ProgressReader::apply(r, step(10, "fwd"), at(40));  // 4 steps in 8 s: 2 s each, once
  REQUIRE(r.step_s.size() == 2);
  CHECK(r.step_s[1] == Approx(2.0));
  CHECK(r.step == 10);
  CHECK(r.last_change == at(40));

  ProgressReader::apply(r, step(3), at(41));  // went back: taken, no duration
  CHECK(r.step == 3);
  CHECK(r.phase.empty());
  CHECK(r.step_s.size() == 2);
  ProgressReader::apply(r, step(4), at(44));
  REQUIRE(r.step_s.size() == 3);
  CHECK(r.step_s.back() == Approx(3.0));
}

TEST_CASE("apply: only the last kStepHistory durations are kept", "[unit][launch][progress]") {
  RankProgress r;
  ProgressReader::apply(r, step(0), at(0));
  for (int i = 1; i <= static_cast<int>(kStepHistory) + 5; ++i) {
    ProgressReader::apply(r, step(i), at(i * (i + 1) / 2.0));  // step i lasts i seconds
  }
  REQUIRE(r.step_s.size() == kStepHistory);
  CHECK(r.step_s.front() == Approx(6.0));
  CHECK(r.step_s.back() == Approx(static_cast<double>(kStepHistory) + 5));
  ProgressReader::apply(r, step(INT64_MAX), at(1000));  // a huge jump: no overflow
  CHECK(r.step == INT64_MAX);
  CHECK(r.step_s.back() >= 0.0);
}

TEST_CASE("ProgressReader over real pipes", "[unit][launch][progress]") {
  ProgressReader reader;
  const int w0 = reader.open_rank(0, at(0));
  const int w1 = reader.open_rank(1, at(0));
  REQUIRE(w0 >= 0);
  REQUIRE(w1 >= 0);
  CHECK((::fcntl(w0, F_GETFD) & FD_CLOEXEC) != 0);  // only the worker's keep list passes it on
  CHECK((::fcntl(w0, F_GETFL) & O_NONBLOCK) != 0);  // a writer never blocks
  REQUIRE(reader.fds().size() == 2);
  CHECK(reader.ranks().at(0).step == -1);
  CHECK_FALSE(reader.ranks().at(0).reported);
  CHECK(reader.ranks().at(1).last_change == at(0));

  // The test keeps its own copies of the write ends; after_start closes the reader's.
  const int mine0 = ::fcntl(w0, F_DUPFD_CLOEXEC, 3);
  int mine1 = ::fcntl(w1, F_DUPFD_CLOEXEC, 3);
  REQUIRE(mine0 >= 0);
  REQUIRE(mine1 >= 0);
  reader.after_start();
  CHECK(::fcntl(w0, F_GETFD) == -1);
  CHECK(::fcntl(w1, F_GETFD) == -1);

  auto fd_of = [&](int rank) {  // read ends are made in open order: rank 0's is the lower
    auto fds = reader.fds();
    return rank == 0 ? fds.front() : fds.back();
  };
  const int r0 = fd_of(0), r1 = fd_of(1);

  SECTION("lines, partial lines, CRLF, junk") {
    write_all(mine0, "step=1 phase=fwd\n");
    reader.on_readable(r0, at(1));
    CHECK(reader.ranks().at(0).step == 1);
    CHECK(reader.ranks().at(0).phase == "fwd");
    CHECK(reader.ranks().at(1).step == -1);  // the other rank's pipe is its own

    write_all(mine0, "ste");  // split across reads
    reader.on_readable(r0, at(2));
    CHECK(reader.ranks().at(0).step == 1);
    write_all(mine0, "p=2\r\n");
    reader.on_readable(r0, at(3));
    CHECK(reader.ranks().at(0).step == 2);
    CHECK(reader.ranks().at(0).phase.empty());
    REQUIRE(reader.ranks().at(0).step_s.size() == 1);
    CHECK(reader.ranks().at(0).step_s[0] == Approx(2.0));

    write_all(mine0, "junk\n\n-4\n3\nnot progress\n");  // blank lines are not counted
    reader.on_readable(r0, at(4));
    CHECK(reader.ranks().at(0).step == 3);
    CHECK(reader.ranks().at(0).bad_lines == 3);
  }

  SECTION("several steps in one read count as several") {
    write_all(mine1, "10\n");
    reader.on_readable(r1, at(1));
    write_all(mine1, "11\n12\n13 \n14\n");
    reader.on_readable(r1, at(9));
    const auto& r = reader.ranks().at(1);
    CHECK(r.step == 14);
    REQUIRE(r.step_s.size() == 1);
    CHECK(r.step_s[0] == Approx(2.0));
  }

  SECTION("a line over kMaxProgressLine is dropped and counted once") {
    write_all(mine0, "5\n" + std::string(kMaxProgressLine - 2, '7'));
    reader.on_readable(r0, at(1));
    write_all(mine0, std::string(3000, '7'));  // now past the bound, split across reads
    reader.on_readable(r0, at(2));
    write_all(mine0, std::string(3000, '7') + "\n6\n");
    reader.on_readable(r0, at(3));
    const auto& r = reader.ranks().at(0);
    CHECK(r.step == 6);  // not 777...
    CHECK(r.bad_lines == 1);

    write_all(mine0, std::string(kMaxProgressLine - 1, ' ') + "8\n");  // at the bound: taken
    reader.on_readable(r0, at(4));
    CHECK(reader.ranks().at(0).step == 8);
    CHECK(reader.ranks().at(0).bad_lines == 1);
  }

  SECTION("EOF: a last line without newline is taken and the pipe is closed") {
    write_all(mine1, "step=4 phase=ckpt");
    ::close(mine1);
    mine1 = -1;
    reader.on_readable(r1, at(1));
    for (int i = 0; i < 3 && reader.fds().size() == 2; ++i) reader.on_readable(r1, at(1));
    CHECK(reader.ranks().at(1).step == 4);
    CHECK(reader.ranks().at(1).phase == "ckpt");
    REQUIRE(reader.fds().size() == 1);
    CHECK(reader.fds().front() == r0);
    CHECK(reader.ranks().count(1) == 1);  // the state stays
  }

  SECTION("activity by another channel") {
    reader.note_activity(1, at(7));
    CHECK(reader.ranks().at(1).reported);
    CHECK(reader.ranks().at(1).last_change == at(7));
    CHECK(reader.ranks().at(1).step == -1);
    write_all(mine1, "3\n");
    reader.on_readable(r1, at(8));
    CHECK(reader.ranks().at(1).step == 3);
    CHECK(reader.ranks().at(1).step_s.empty());  // the first step has no duration
  }

  SECTION("a full pipe refuses the writer instead of blocking it") {
    const std::string line = "step=1\n";
    int writes = 0;
    while (::write(mine0, line.data(), line.size()) > 0 && writes < (1 << 20)) ++writes;
    CHECK(errno == EAGAIN);
    for (int i = 0; i < 64; ++i) reader.on_readable(r0, at(1));
    CHECK(reader.ranks().at(0).step == 1);
    CHECK(reader.ranks().at(0).bad_lines == 0);
  }

  ::close(mine0);
  if (mine1 >= 0) ::close(mine1);
}

TEST_CASE("a rank that reports phase compute is timed by that phase, on its own clock",
          "[unit][launch][progress]") {
  // Under a synchronous all-reduce both ranks finish steps together; only compute differs.
  RankProgress fast, slow;
  const SteadyTime now{};
  auto line = [](std::int64_t step, const char* phase, double t) {
    ProgressLine l;
    l.step = step;
    l.phase = phase;
    l.t = t;
    return l;
  };
  for (int s = 0; s < 4; ++s) {
    const double base = 10.0 * s;
    ProgressReader::apply(fast, line(s, "compute", base), now);
    ProgressReader::apply(fast, line(s, "allreduce", base + 1), now);
    ProgressReader::apply(slow, line(s, "compute", base), now);
    ProgressReader::apply(slow, line(s, "allreduce", base + 3), now);
  }
  REQUIRE(fast.step_s.size() == 4);
  REQUIRE(slow.step_s.size() == 4);
  for (double d : fast.step_s) CHECK(d == Approx(1.0));
  for (double d : slow.step_s) CHECK(d == Approx(3.0));
  CHECK(fast.phased);
  // Without phases: the interval between steps, on the worker's clock.
  RankProgress plain;
  for (int s = 0; s < 3; ++s) {
    ProgressLine l;
    l.step = s;
    l.t = 2.0 * s;
    ProgressReader::apply(plain, l, now);
  }
  REQUIRE(plain.step_s.size() == 2);
  CHECK(plain.step_s[0] == Approx(2.0));
}

TEST_CASE("progress lines: the in-place recovery declaration", "[unit][launch][progress]") {
  auto alone = parse_progress_line("recover=in_place");
  REQUIRE(alone);
  CHECK(alone->recover_in_place);
  CHECK(alone->step == -1);  // a declaration, not a step
  auto with_step = parse_progress_line("step=3 recover=in_place");
  REQUIRE(with_step);
  CHECK(with_step->recover_in_place);
  CHECK(with_step->step == 3);
  CHECK_FALSE(parse_progress_line("recover=yes"));  // in_place or restart only
  CHECK_FALSE(parse_progress_line("step=3").value().recover_in_place);
  // "recover=restart" withdraws a declaration: the last said holds.
  auto withdrawn = parse_progress_line("recover=restart");
  REQUIRE(withdrawn);
  CHECK(withdrawn->recover_restart);
  CHECK_FALSE(withdrawn->recover_in_place);
  RankProgress r;
  const auto now = SteadyTime{};
  ProgressReader::apply(r, *alone, now);
  CHECK(r.recovers_in_place);
  ProgressReader::apply(r, *parse_progress_line("step=4"), now);
  CHECK(r.recovers_in_place);  // a step line leaves it
  ProgressReader::apply(r, *withdrawn, now);
  CHECK_FALSE(r.recovers_in_place);
  ProgressReader::apply(r, *with_step, now);
  CHECK(r.recovers_in_place);
}

TEST_CASE("progress lines: recover=elastic regroups, a heal's end is timed",
          "[unit][launch][progress]") {
  auto elastic = parse_progress_line("recover=elastic");
  REQUIRE(elastic);
  CHECK(elastic->recover_in_place);  // in place too
  CHECK(elastic->recover_regroup);
  RankProgress r;
  const auto now = SteadyTime{};
  ProgressReader::apply(r, *elastic, now);
  CHECK(r.regroups);
  ProgressReader::apply(r, *parse_progress_line("recover=in_place"), now);
  CHECK_FALSE(r.regroups);  // the last said holds
  CHECK(r.recovers_in_place);
  ProgressReader::apply(r, *parse_progress_line("step=7 phase=heal t=100.0"), now);
  CHECK(r.healed_unix < 0);
  ProgressReader::apply(r, *parse_progress_line("step=7 phase=heal t=100.2"), now);
  CHECK(r.healed_unix < 0);
  ProgressReader::apply(r, *parse_progress_line("step=7 phase=compute t=100.5"), now);
  CHECK(r.healed_unix == Approx(100.5));
}

TEST_CASE("the control pipe: the agent's lines reach the worker's reader whole",
          "[unit][launch][progress]") {
  ProgressReader reader;
  reader.open_rank(0, at(0));
  const int theirs = reader.control_end(0);
  REQUIRE(theirs >= 3);
  CHECK(reader.control_end(1) == -1);
  CHECK_FALSE(reader.tell(1, "x\n"));  // no such rank
  // The worker's side: ProgressWriter::listen() on a copy of the read end (after_start closes
  // the agent's copy, as it does once the worker holds its own).
  const int mine = ::dup(theirs);
  reader.after_start();
  CHECK(reader.control_end(0) == -1);
  ddp::worker::ProgressWriter w;
  std::string why;
  REQUIRE(w.listen(mine, &why));
  CHECK_FALSE(w.take_line());  // nothing yet, and no block
  REQUIRE(reader.tell(0, "regroup round=1\nsecond"));
  CHECK(w.take_line() == std::optional<std::string>("regroup round=1"));
  CHECK_FALSE(w.take_line());  // "second" has no newline yet
  REQUIRE(reader.tell(0, " half\n" + std::string(2000, 'x') + "\nthird\n"));
  CHECK(w.take_line() == std::optional<std::string>("second half"));
  CHECK(w.take_line() == std::optional<std::string>("third"));  // the overlong one dropped
  CHECK_FALSE(w.listen(1 << 20, &why));
  CHECK_THAT(why, Catch::Contains("DDPRUN_CONTROL_FD=1048576"));
  ::close(mine);
}
