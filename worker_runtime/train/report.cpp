// Progress lines and the test-set evaluation (see report.hpp).
#include "report.hpp"

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/kernels/cpu_ref.hpp"

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

}  // namespace ddp::train
