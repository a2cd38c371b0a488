// Tests of the metrics on progress lines (issue 36): the agent's parser takes any key=value
// number past the known keys, counts what is not one (a word, inf, a bad name, too many) while
// the line still counts, bounds the names a rank keeps, and merges untimed lines' metrics; the
// worker's writer puts at most four on a line, finite and well named.
#include <catch2/catch.hpp>
#include <string>

#include "ddp/launch/progress.hpp"
#include "ddp/proto/metric_name.hpp"
#include "ddp/worker/progress.hpp"

using namespace ddp::launch;

TEST_CASE("progress metrics: numbers kept, the rest counted, the line still counts", "[progress]") {
  const auto l = parse_progress_line("step=7 loss=2.5 lr=3e-4 delta=-0.25 acc=+1 x=abc y=inf 9z=1");
  REQUIRE(l);
  CHECK(l->step == 7);
  REQUIRE(l->metrics.size() == 4);
  CHECK(l->metrics[0] == std::make_pair(std::string("loss"), 2.5));
  CHECK(l->metrics[1].second == Approx(3e-4));
  CHECK(l->metrics[2].second == -0.25);
  CHECK(l->metrics[3].second == 1);
  CHECK(l->bad_metrics == 3);  // a word, inf, a name starting with a digit
  CHECK(l->bad_metric == "'x=abc': not a finite number");  // the first, named
  CHECK(parse_progress_line("step=1 9z=1")->bad_metric ==
        "'9z=1': not a metric name ([A-Za-z_][A-Za-z0-9_.-]*, at most 48 bytes)");
  CHECK(parse_progress_line("step=1 bell=\x07" + std::string(100, 'x'))->bad_metric ==
        "'bell=?" + std::string(58, 'x') + "...': not a finite number");
  std::string many = "step=1";
  for (int i = 0; i < 40; ++i) many += " m" + std::to_string(i) + "=1";
  const auto m = parse_progress_line(many);
  REQUIRE(m);
  CHECK(m->metrics.size() == kMaxLineMetrics);
  CHECK(m->bad_metrics == 40 - static_cast<int>(kMaxLineMetrics));
  CHECK(ddp::metric_name_ok("val_loss"));
  CHECK(!ddp::metric_name_ok(std::string(49, 'a')));
  CHECK(ddp::is_throughput_metric("tokens_per_s"));
  CHECK(!ddp::is_throughput_metric("_per_s"));
}

TEST_CASE("progress metrics: a rank keeps at most kMaxRankMetrics names", "[progress]") {
  RankProgress r;
  ProgressLine l;
  l.step = 1;
  for (std::size_t i = 0; i < ddp::kMaxRankMetrics + 3; ++i) {
    l.metrics.emplace_back("m" + std::to_string(i), static_cast<double>(i));
  }
  l.bad_metrics = 2;
  ProgressReader::apply(r, l, SteadyTime{});
  CHECK(r.metrics.size() == ddp::kMaxRankMetrics);
  CHECK(r.bad_metrics == 2 + 3);
  CHECK(r.bad_metric == "'m16': more than 16 metric names from one worker");
  CHECK(r.metric_lines == 1);
  CHECK(r.metrics.at("m0").line == 1);
  CHECK(r.metrics.at("m0").step == 1);
}

TEST_CASE("progress metrics: the worker's line", "[progress]") {
  using ddp::worker::format_progress_line;
  using ddp::worker::LineMetric;
  char buf[ddp::worker::kProgressLineMax];
  const LineMetric ms[] = {{"loss", 2.5},       {"bad name", 1}, {"lr", 1e300 * 1e300},
                           {"val_loss", 0.125}, {"a", 1},        {"b", 2}};
  const std::string line(buf, format_progress_line(buf, 3, "compute", -1, -1, -1, ms, 6));
  // At most four are looked at; the bad name and the infinite value are left out.
  CHECK(line == "step=3 phase=compute loss=2.5 val_loss=0.125\n");
  const auto back = parse_progress_line(line.substr(0, line.size() - 1));
  REQUIRE(back);
  CHECK(back->metrics.size() == 2);
  CHECK(back->bad_metrics == 0);
  // The longest line fits: every field at its widest, four 32-byte names.
  const std::string n32(32, 'n');
  const LineMetric wide[] = {{n32.c_str(), -1.2345678901234567e-300},
                             {n32.c_str(), -1e-300},
                             {n32.c_str(), -1e-300},
                             {n32.c_str(), -1e-300}};
  const std::size_t len = format_progress_line(buf, INT64_MAX, std::string(40, 'p'), INT64_MAX,
                                               INT64_MAX, INT64_MAX, wide, 4);
  CHECK(len <= ddp::worker::kProgressLineMax);
}
