// Progress lines and the test-set evaluation (see report.hpp).
#include "report.hpp"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/kernels/cpu_ref.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::train {

void print_progress(std::ostream& out, bool tty, const ProgressLine& p) {
  std::ostringstream line;
  line << "epoch " << p.epoch + 1 << "/" << p.epochs << " step " << p.step << "/" << p.steps
       << " loss " << std::fixed << std::setprecision(4) << p.loss << " samples/s "
       << std::setprecision(0) << p.samples_per_sec;
  if (tty) {
    constexpr int kWidth = 30;
    const auto filled = p.steps > 0 ? static_cast<int>(kWidth * p.step / p.steps) : kWidth;
    out << "\r[" << std::string(static_cast<std::size_t>(filled), '#')
        << std::string(static_cast<std::size_t>(kWidth - filled), '.') << "] " << line.str()
        << (p.end ? "\n" : "") << std::flush;
  } else {
    out << line.str() << "\n" << std::flush;
  }
}

double evaluate(Engine& engine, const Dataset& test, std::ostream& out, nlohmann::json& metrics) {
  if (test.n == 0) return 0.0;
  const ModelSpec& spec = engine.model().spec();
  const std::size_t out_dim = spec.layers.back().out;
  std::size_t correct = 0;
  double sq = 0.0;
  std::vector<float> scratch;
  for (std::size_t at = 0; at < test.n; at += kPredictChunkRows) {
    const std::size_t rows = std::min(kPredictChunkRows, test.n - at);
    const float* x = test.x.data() + at * test.dim;
    const float* y = engine.predict(x, rows);
    if (spec.loss == Loss::cross_entropy) {
      correct += kernels::cpu::count_correct(y, test.labels.data() + at, rows, out_dim);
    } else {
      scratch.resize(rows * out_dim);
      sq += kernels::cpu::mse(y, x, scratch.data(), rows * out_dim, 1.0f);
    }
  }
  if (spec.loss == Loss::cross_entropy) {
    const double acc = static_cast<double>(correct) / static_cast<double>(test.n);
    metrics["test_accuracy"] = acc;
    out << "test accuracy: " << std::fixed << std::setprecision(4) << acc << " (" << correct << "/"
        << test.n << ")\n";
    return acc;
  }
  const double mse = sq / static_cast<double>(test.n * test.dim);
  metrics["test_mse"] = mse;
  out << "test mse: " << std::fixed << std::setprecision(6) << mse << "\n";
  return mse;
}

namespace {

// The process's peak resident memory (VmHWM), 0 where /proc does not say.
std::size_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace

void final_report(Engine& engine, const RunSummary& s, const Dataset& test, bool eval,
                  const std::string& path, std::ostream& out,
                  const std::function<void()>& before_eval) {
  nlohmann::json m;
  m["model"] = s.model;
  m["dataset"] = s.dataset;
  m["world_size"] = s.world_size;
  m["batch_size"] = s.batch_size;
  m["epochs_run"] = s.epoch_losses.size();
  m["epoch_losses"] = s.epoch_losses;
  m["steps"] = s.steps;
  m["global_step"] = s.global_step;
  m["train_seconds"] = s.seconds;
  const double rate = s.seconds > 0 ? static_cast<double>(s.samples) / s.seconds : 0.0;
  m["samples_per_sec"] = rate;
  m["final_loss"] = s.final_loss;
  m["step_losses"] = s.step_losses;
  std::ostringstream sum;
  sum << std::hex << std::setw(16) << std::setfill('0') << s.param_checksum;
  m["param_checksum"] = sum.str();
  m["sharding"] = s.sharding;
  m["optimizer"] = s.optimizer;
  m["lr"] = s.lr;
  m["lr_gamma"] = s.lr_gamma;
  m["state_bytes_peak"] = s.state_bytes_peak;
  m["rss_peak_bytes"] = peak_rss_bytes();
  m["resumed_from"] = s.resumed_from ? nlohmann::json{{"epoch", s.resumed_from->first},
                                                      {"step", s.resumed_from->second}}
                                     : nlohmann::json(nullptr);
  out << "ddp-train: " << s.steps << " steps in " << std::fixed << std::setprecision(2) << s.seconds
      << " s, " << std::setprecision(0) << rate << " samples/s, final loss " << std::setprecision(4)
      << s.final_loss << "\n";
  if (eval) {
    if (before_eval) before_eval();
    evaluate(engine, test, out, m);
  }
  out << std::flush;
  if (!path.empty()) {
    std::ofstream f(path);
    f << m.dump(2) << "\n";
    if (!f) throw IoError("--metrics-json " + path + ": cannot write");
  }
}

}  // namespace ddp::train
