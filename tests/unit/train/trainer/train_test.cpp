// ddp-train's pure pieces: IDX parsing, the sampler, every layer's gradient against finite
// differences, the optimizers against torch's formulas, bucket plans, snapshot encoding,
// DDP_TRAIN_FAULT's forms, and the progress lines written to DDPRUN_PROGRESS_FD.
#include <catch2/catch.hpp>
#include <cmath>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>

#include "data.hpp"
#include "ddp/kernels/check.hpp"
#include "ddp/kernels/cpu_ref.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/worker/progress.hpp"
#include "model.hpp"
#include "optimizer.hpp"
#include "options.hpp"
#include "reducer.hpp"
#include "sampler.hpp"
#include "snapshot.hpp"

using namespace ddp::train;

namespace {

std::string idx_bytes(std::vector<std::uint32_t> dims, std::size_t payload) {
  std::string b = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (auto d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((d >> s) & 0xff));
  }
  for (std::size_t i = 0; i < payload; ++i) b.push_back(static_cast<char>(i % 251));
  return b;
}

}  // namespace

TEST_CASE("IDX: dimensions and data are read, a bad file is named with what is wrong",
          "[unit][train]") {
  auto a = parse_idx(idx_bytes({2, 3, 4}, 24), "x.idx");
  CHECK(a.dims == std::vector<std::uint32_t>{2, 3, 4});
  CHECK(a.data.size() == 24);
  CHECK(a.data[5] == 5);
  CHECK_THROWS_WITH(parse_idx(idx_bytes({2, 3, 4}, 23), "x.idx"),
                    Catch::Contains("x.idx") && Catch::Contains("truncated"));
  CHECK_THROWS_WITH(parse_idx(idx_bytes({2}, 3), "y.idx"), Catch::Contains("3 bytes"));
  CHECK_THROWS_WITH(parse_idx("GIF89a....", "z.idx"), Catch::Contains("bad magic"));
  std::string floats = idx_bytes({1}, 1);
  floats[2] = 0x0D;
  CHECK_THROWS_WITH(parse_idx(floats, "f.idx"), Catch::Contains("not supported"));
  CHECK_THROWS_AS(parse_idx("", "e.idx"), ddp::ConfigError);
  CHECK_THROWS_WITH(read_idx_file("/nonexistent/train.gz"),
                    Catch::Contains("/nonexistent/train.gz"));
  CHECK_THROWS_WITH(load_fashion_mnist("/nonexistent", true, 0),
                    Catch::Contains("--data /nonexistent"));
}

TEST_CASE("IDX files: gzipped or plain are read, a truncated gzip stream is named",
          "[unit][train]") {
  char tmpl[] = "/tmp/ddp-idx-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string raw = idx_bytes({4, 5}, 20);
  {
    std::ofstream(dir + "/plain.idx", std::ios::binary) << raw;
    gzFile gz = ::gzopen((dir + "/packed.idx.gz").c_str(), "wb");
    REQUIRE(gz != nullptr);
    REQUIRE(::gzwrite(gz, raw.data(), static_cast<unsigned>(raw.size())) ==
            static_cast<int>(raw.size()));
    ::gzclose(gz);
  }
  CHECK(read_idx_file(dir + "/plain.idx").data == read_idx_file(dir + "/packed.idx.gz").data);
  // A limit reads only the first items (4 of 5 bytes each here), a limit past the end all.
  for (const char* name : {"/plain.idx", "/packed.idx.gz"}) {
    const IdxArray two = read_idx_file(dir + name, 2);
    CHECK(two.dims == std::vector<std::uint32_t>{2, 5});
    CHECK(two.data == std::vector<std::uint8_t>(raw.begin() + 12, raw.begin() + 22));
    CHECK(read_idx_file(dir + name, 9).dims == std::vector<std::uint32_t>{4, 5});
  }
  std::ofstream(dir + "/long.idx", std::ios::binary) << raw << "x";
  CHECK_THROWS_WITH(read_idx_file(dir + "/long.idx"), Catch::Contains("21 bytes"));
  CHECK(read_idx_file(dir + "/long.idx", 3).dims[0] == 3);  // checked only as far as read
  std::ifstream in(dir + "/packed.idx.gz", std::ios::binary);
  std::string packed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir + "/cut.idx.gz", std::ios::binary) << packed.substr(0, packed.size() / 2);
  CHECK_THROWS_WITH(read_idx_file(dir + "/cut.idx.gz"), Catch::Contains(dir + "/cut.idx.gz"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("sampler: ranks split a padded permutation like DistributedSampler", "[unit][train]") {
  const std::size_t n = 10;
  const int world = 3;  // 10 -> 12 padded, 4 per rank
  std::multiset<std::uint32_t> all;
  for (int r = 0; r < world; ++r) {
    auto mine = shard_indices(n, world, r, 7, 0);
    CHECK(mine.size() == 4);
    all.insert(mine.begin(), mine.end());
  }
  CHECK(all.size() == 12);
  for (std::uint32_t i = 0; i < n; ++i) CHECK(all.count(i) >= 1);  // every sample is seen
  // Deterministic per (seed, epoch); reshuffled per epoch; unshuffled is the identity.
  CHECK(shard_indices(n, world, 1, 7, 0) == shard_indices(n, world, 1, 7, 0));
  CHECK(shard_indices(1000, 2, 0, 7, 0) != shard_indices(1000, 2, 0, 7, 1));
  CHECK(shard_indices(1000, 2, 0, 7, 0) != shard_indices(1000, 2, 0, 8, 0));
  CHECK(shard_indices(6, 2, 1, 0, 0, false) == std::vector<std::uint32_t>{1, 3, 5});
  // One rank with batch B sees, in its first batch, exactly the union of N ranks' first B/N.
  auto one = shard_indices(64, 1, 0, 3, 2);
  std::set<std::uint32_t> first8(one.begin(), one.begin() + 8), unioned;
  for (int r = 0; r < 2; ++r) {
    auto mine = shard_indices(64, 2, r, 3, 2);
    unioned.insert(mine.begin(), mine.begin() + 4);
  }
  CHECK(first8 == unioned);
  CHECK(shard_indices(3, 8, 7, 0, 0).size() == 1);  // padding repeats when world > n
}

namespace {

// Central finite differences of the batch-mean loss against backward's gradient, for every
// parameter of a small model of the given layers.
// training: dropout on, with a fixed seed (the same masks in every forward, so the loss is a
// deterministic function of the parameters). h: the finite difference's step, small enough that
// no ReLU or max-pool kink lies within it for the spec's fixed inputs and parameters.
void check_gradients(ModelSpec spec, bool training = false, float h = 1e-2f) {
  Model model(spec);
  model.init(3);
  const std::size_t rows = 3;
  const std::size_t in = spec.layers.front().in;
  const std::size_t out = spec.layers.back().out;
  SplitMix64 rng(11);
  std::vector<float> x(rows * in), t(rows * out);
  std::vector<std::uint8_t> labels(rows);
  for (auto& v : x) v = rng.uniform() * 2.0f - 1.0f;
  if (spec.autoencoder) {
    for (auto& v : x) v = (v + 1.0f) / 2.0f;  // pixels
    t = x;
  } else {
    for (auto& v : t) v = rng.uniform();
  }
  for (auto& l : labels) l = static_cast<std::uint8_t>(rng.next() % out);
  auto loss_at = [&]() {
    model.set_dropout_seed(42);
    model.forward(x.data(), rows, training);
    return model.loss(labels.data(), t.data(), rows, 1.0f / rows) / rows;
  };
  model.zero_grads();
  loss_at();
  std::vector<std::size_t> done;
  model.backward(x.data(), rows, [&](std::size_t layer) { done.push_back(layer); });
  std::vector<std::size_t> expect(spec.layers.size());
  std::iota(expect.rbegin(), expect.rend(), 0);
  CHECK(done == expect);  // layer callbacks come last layer first
  const std::vector<float> grad = model.grads();
  auto& p = model.params();
  std::size_t checked = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < p.size(); i += 1 + p.size() / 400) {
    const float keep = p[i];
    p[i] = keep + h;
    const double up = loss_at();
    p[i] = keep - h;
    const double down = loss_at();
    p[i] = keep;
    const double fd = (up - down) / (2.0 * h);
    const double err = std::abs(fd - grad[i]) / std::max(1e-2, std::abs(fd) + std::abs(grad[i]));
    worst = std::max(worst, err);
    ++checked;
  }
  INFO(spec.name << ": worst relative error " << worst << " over " << checked << " parameters");
  CHECK(checked > 10);
  CHECK(worst < 2e-2);
}

}  // namespace

TEST_CASE("gradients of every layer kind match finite differences", "[unit][train]") {
  SECTION("relu layers + softmax cross-entropy") {
    check_gradients({"small-mlp",
                     {{6, 5, Act::relu}, {5, 4, Act::relu}, {4, 3, Act::none}},
                     Loss::cross_entropy,
                     false});
  }
  SECTION("sigmoid output + mse against the input (autoencoder)") {
    check_gradients({"small-ae", {{6, 4, Act::relu}, {4, 6, Act::sigmoid}}, Loss::mse, true});
  }
  SECTION("linear regression") { check_gradients({"lin", {{5, 2, Act::none}}, Loss::mse, false}); }
  SECTION("conv, pool and dropout layers") {
    // 2x6x5 -> conv 3 ch 3x3 ReLU (3x4x3) -> max-pool 2 (3x2x1) -> dropout 0.3 -> Linear(6, 4).
    check_gradients({"small-conv",
                     {conv_layer(2, 6, 5, 3, 3, Act::relu, 2, 0.3f), {6, 4, Act::none}},
                     Loss::cross_entropy,
                     false},
                    true);
    // Two convs (the second's input gradient flows into the first), a rectangular input, and
    // dropout after a hidden Linear, as in the convnet. A ReLU kink lies within 1e-2 of one
    // hidden unit's input here: a smaller step.
    LayerSpec hidden{8, 5, Act::relu};
    hidden.dropout = 0.5f;
    check_gradients({"two-conv",
                     {conv_layer(2, 6, 5, 3, 2, Act::relu, 0, 0.0f),
                      conv_layer(3, 5, 4, 4, 2, Act::relu, 2, 0.25f),
                      hidden,
                      {5, 3, Act::none}},
                     Loss::cross_entropy,
                     false},
                    true, 3e-3f);
  }
  SECTION("the shipped models' shapes") {
    CHECK(Model(model_spec("convnet")).param_count() == 1199882);
    CHECK(Model(model_spec(ModelKind::convnet)).param_count() ==
          32 * 9 + 32 + 64 * 32 * 9 + 64 + 9216 * 128 + 128 + 128 * 10 + 10);
    CHECK(Model(model_spec("mlp")).param_count() == 784 * 256 + 256 + 256 * 128 + 128 + 1290);
    CHECK(Model(model_spec("autoencoder")).param_count() ==
          784 * 128 + 128 + 2 * (128 * 128 + 128) + 128 * 784 + 784);
    CHECK(Model(model_spec("linear")).param_count() == 21);
    CHECK_THROWS_WITH(model_spec("resnet"), Catch::Contains("--model 'resnet'"));
  }
}

TEST_CASE("optimizers follow torch's formulas", "[unit][train]") {
  SECTION("SGD with momentum") {
    Optimizer opt({OptimizerKind::sgd, 0.1f, 0.9f}, 1);
    float p = 1.0f;
    const float g = 2.0f;
    opt.step(&p, &g);  // buf = 2, p = 1 - 0.2
    CHECK(p == Approx(0.8f));
    opt.step(&p, &g);  // buf = 0.9*2 + 2 = 3.8, p = 0.8 - 0.38
    CHECK(p == Approx(0.42f));
  }
  SECTION("Adam: the first step moves each parameter by lr against its gradient's sign") {
    Optimizer opt({OptimizerKind::adam, 0.01f}, 2);
    float p[2] = {1.0f, -1.0f};
    const float g[2] = {0.5f, -3.0f};
    opt.step(p, g);
    CHECK(p[0] == Approx(0.99f).epsilon(1e-5));
    CHECK(p[1] == Approx(-0.99f).epsilon(1e-5));
    CHECK(opt.steps() == 1);
    // m = 0.1 g, v = 0.001 g^2
    CHECK(opt.state()[0] == Approx(0.05f));
    CHECK(opt.state()[2] == Approx(0.00025f).epsilon(1e-4));  // 1 - 0.999f is not exact
  }
  ChoiceWords lamb;
  lamb.optimizer = "lamb";
  TrainOptions o;
  CHECK_THROWS_WITH(apply_choices(
                        lamb, [] { return false; }, o),
                    Catch::Contains("--optimizer 'lamb'"));
}

TEST_CASE("buckets: whole layers, last layer first, contiguous, the first one small",
          "[unit][train]") {
  Model m(model_spec("mlp"));
  auto one = plan_buckets(m, 1 << 20, 25u << 20);
  REQUIRE(one.size() == 1);
  CHECK(one[0].begin == 0);
  CHECK(one[0].end == m.param_count());
  CHECK(one[0].last_layer == 0);
  auto many = plan_buckets(m, 4096, 200 * 1024);  // 128x10 alone, 256x128 alone, 784x256 alone
  REQUIRE(many.size() == 3);
  CHECK(many[0].last_layer == 2);
  CHECK(many[1].last_layer == 1);
  CHECK(many[2].last_layer == 0);
  for (std::size_t i = 1; i < many.size(); ++i) CHECK(many[i].begin == many[i - 1].end);
  CHECK(many.back().end == m.param_count());
}

TEST_CASE("snapshot: round trip, corruption, truncation and garbage are named", "[unit][train]") {
  Snapshot s;
  s.header.model = "mlp";
  s.header.optimizer = "adam";
  s.header.epoch = 2;
  s.header.step = 17;
  s.header.global_step = 957;
  s.header.adam_t = 957;
  s.header.seed = 42;
  s.header.lr = 1e-3;
  s.header.world_size = 2;
  s.header.batch_size = 64;
  s.params = {1.5f, -2.0f, 3.25f};
  s.opt_state = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  const std::string bytes = encode_snapshot(s);
  CHECK(bytes.substr(0, 8) == "DDPSNAP1");
  Snapshot r = decode_snapshot(bytes, "snap");
  CHECK(r.header.model == "mlp");
  CHECK(r.header.step == 17);
  CHECK(r.header.global_step == 957);
  CHECK(r.header.seed == 42);
  CHECK(r.params == s.params);
  CHECK(r.opt_state == s.opt_state);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x01;
  CHECK_THROWS_WITH(decode_snapshot(flipped, "snap"),
                    Catch::Contains("snap") && Catch::Contains("checksum"));
  CHECK_THROWS_WITH(decode_snapshot(bytes.substr(0, bytes.size() - 5), "snap"),
                    Catch::Contains("checksum"));
  CHECK_THROWS_WITH(decode_snapshot("hello world, not a snapshot", "g"), Catch::Contains("magic"));
  CHECK(fnv1a64("a", 1) == 0xaf63dc4c8601ec8cull);  // the published FNV-1a 64 test vector
  CHECK_FALSE(read_snapshot_file("/nonexistent/dir/snap").has_value());
}

TEST_CASE("cpu references: softmax cross-entropy and mse", "[unit][train]") {
  const float logits[3] = {0.0f, 0.0f, 0.0f};
  const std::uint8_t label = 1;
  float d[3];
  CHECK(ddp::kernels::cpu::softmax_xent(logits, &label, d, 1, 3, 1.0f) == Approx(std::log(3.0)));
  CHECK(d[0] == Approx(1.0 / 3));
  CHECK(d[1] == Approx(1.0 / 3 - 1));
  const float big[2] = {1000.0f, 0.0f};  // stable: no overflow
  const std::uint8_t zero = 0;
  CHECK(ddp::kernels::cpu::softmax_xent(big, &zero, d, 1, 2, 1.0f) == Approx(0.0).margin(1e-6));
  const float y[2] = {1.0f, 3.0f}, t[2] = {0.0f, 1.0f};
  CHECK(ddp::kernels::cpu::mse(y, t, d, 2, 0.5f) == Approx(5.0));
  CHECK(d[1] == Approx(2.0f));
}

TEST_CASE("cpu references: bf16 casts round to nearest even", "[unit][train]") {
  using ddp::kernels::cpu::bf16_to_f32;
  using ddp::kernels::cpu::f32_to_bf16;
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(bf16_to_f32(0x3f80) == 1.0f);
  CHECK(bf16_to_f32(f32_to_bf16(-2.5f)) == -2.5f);  // exact in bf16
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  CHECK(f32_to_bf16(1.00390625f) == 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  CHECK(f32_to_bf16(1.01171875f) == 0x3f82);
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  CHECK(std::isinf(bf16_to_f32(f32_to_bf16(3.4e38f))));  // past the largest bf16, 3.39e38
  const float x = 3.14159f;
  CHECK(std::abs(bf16_to_f32(f32_to_bf16(x)) - x) <= x / 256);  // 8 bits of mantissa
}

TEST_CASE("options: the words become enums once, a bad word names its flag", "[unit][train]") {
  const auto no_gpu = [] { return false; };
  TrainOptions o;
  apply_choices(ChoiceWords{}, no_gpu, o);  // the flags' defaults
  CHECK(o.device == Device::cpu);
  CHECK(o.backend == Backend::gloo);
  CHECK(o.precision == Precision::fp32);
  CHECK(o.dataset == DatasetKind::fashion_mnist);
  CHECK(o.model == ModelKind::mlp);
  CHECK(o.optimizer.kind == OptimizerKind::adam);  // the mlp's recipe
  ChoiceWords w;
  w.dataset = "synthetic";  // no --model: linear
  w.optimizer = "adam";
  w.device = "auto";
  bool asked = false;
  apply_choices(
      w, [&] { return asked = true; }, o);
  CHECK(asked);
  CHECK(o.device == Device::cuda);
  CHECK(o.backend == Backend::nccl);  // auto follows the device
  CHECK(o.model == ModelKind::linear);
  CHECK(o.optimizer.kind == OptimizerKind::adam);
  CHECK(to_string(o.model) == "linear");
  CHECK(to_string(o.dataset) == "synthetic");
  CHECK(model_named("autoencoder") == ModelKind::autoencoder);
  CHECK_FALSE(optimizer_named("lamb").has_value());
  const auto refused = [&](ChoiceWords bad) {
    TrainOptions t;
    try {
      apply_choices(bad, no_gpu, t);
    } catch (const ddp::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  ChoiceWords bad;
  bad.device = "tpu";
  CHECK(refused(bad) == "--device 'tpu': expected cpu, cuda or auto");
  bad = {};
  bad.backend = "mpi";
  CHECK(refused(bad) == "--backend 'mpi': expected auto, gloo or nccl");
  bad.backend = "nccl";
  CHECK(refused(bad) ==
        "--backend nccl with --device cpu: gradients on the GPU go through nccl, on the CPU "
        "through gloo");
  bad = {};
  bad.precision = "fp8";
  CHECK(refused(bad) == "--precision 'fp8': expected fp32 or bf16");
  bad = {};
  bad.dataset = "cifar";
  CHECK(refused(bad) == "--dataset 'cifar': expected fashion-mnist or synthetic");
  bad = {};
  bad.model = "resnet";
  CHECK(refused(bad) == "--model 'resnet': expected mlp, autoencoder, linear, convnet or llama");
  bad = {};
  bad.optimizer = "rmsprop";
  CHECK(refused(bad) == "--optimizer 'rmsprop': expected sgd, adam, adadelta or adamw");
  o = {};
  o.precision = Precision::bf16;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("--precision bf16 needs --device cuda"));
  o.device = Device::cuda;
  CHECK_NOTHROW(validate(o));
  CHECK(parse_fault("1:5").rank == 1);
  CHECK(parse_fault("1:5").step == 5);
  CHECK(parse_fault("").rank == -1);
  CHECK_THROWS_WITH(parse_fault("1:x"), Catch::Contains("DDP_TRAIN_FAULT='1:x'"));
}

namespace {
namespace fake {
// A library status as check.hpp's macros see one: a predicate and a description.
enum class Status { ok, out_of_memory, weird };
bool ok(Status s) { return s == Status::ok; }
ddp::kernels::detail::StatusText describe(Status s) {
  if (s == Status::out_of_memory) return {"out of memory (fakeErrorMemory)", "lower --batch-size"};
  return {"weird (fakeErrorWeird)", nullptr};
}
int calls = 0;
Status fake_alloc(Status s) {
  ++calls;
  return s;
}
}  // namespace fake
}  // namespace

TEST_CASE("check macros: the failed call, the library's error, what to do, [file:line]",
          "[unit][train]") {
  using fake::Status;
  CHECK_NOTHROW([] {
    DDP_CHECK_STATUS(ddp::CudaError, fake::fake_alloc(Status::ok), fake::ok, fake::describe);
  }());
  CHECK(fake::calls == 1);  // evaluated once
  try {
    DDP_CHECK_STATUS(ddp::CudaError, fake::fake_alloc(Status::out_of_memory), fake::ok,
                     fake::describe);
    FAIL("no throw");
  } catch (const ddp::CudaError& e) {
    CHECK(e.code() == ddp::Errc::cuda);
    CHECK_THAT(e.what(), Catch::StartsWith("fake::fake_alloc(Status::out_of_memory) failed: out "
                                           "of memory (fakeErrorMemory); lower --batch-size "
                                           "[train_test.cpp:"));
  }
  CHECK(fake::calls == 2);
  CHECK_THROWS_AS(
      [] {
        DDP_CHECK_STATUS(ddp::NcclError, fake::fake_alloc(Status::weird), fake::ok, fake::describe);
      }(),
      ddp::NcclError);
  // No hint: the message ends with the error and the place.
  CHECK(ddp::kernels::detail::check_message("f()", {"bad", nullptr}, "/a/b/x.cu", 7) ==
        "f() failed: bad [x.cu:7]");
}

TEST_CASE("DDP_TRAIN_FAULT: kill, hang and slow=F, anything else is named", "[unit][train]") {
  const Fault kill = parse_fault("1:5");
  CHECK((kill.rank == 1 && kill.step == 5 && kill.kind == FaultKind::kill));
  CHECK(parse_fault("0:7:kill").kind == FaultKind::kill);
  const Fault hang = parse_fault("3:0:hang");
  CHECK((hang.rank == 3 && hang.step == 0 && hang.kind == FaultKind::hang));
  const Fault slow = parse_fault("1:2:slow=3");
  CHECK((slow.rank == 1 && slow.step == 2 && slow.kind == FaultKind::slow));
  CHECK(slow.factor == 3.0);
  CHECK(parse_fault("0:0:slow=1.5").factor == 1.5);
  CHECK(parse_fault("").rank == -1);
  for (const char* bad :
       {"1", "1:x", "x:1", "1:5:", "1:5:hung", "1:5:hang:", "1:5:slow", "1:5:slow=", "1:5:slow=1",
        "1:5:slow=0.5", "1:5:slow=x", "1:5:slow=3x", "1:5:slow= 3", "1:5:slow=nan", "1:5:slow=inf",
        "1:5:slow=1001", "-1:5", "1:-5"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_fault(bad), "DDP_TRAIN_FAULT='" + std::string(bad) +
                                            "': expected RANK:STEP (kill), RANK:STEP:KIND with "
                                            "KIND kill, kill@allreduce, kill@after, "
                                            "kill@snapshot, kill@heal or hang, or "
                                            "RANK:STEP:slow=F with F in (1, 1000]");
  }
}

TEST_CASE("DDP_TRAIN_FAULT: the kills at other moments, and one fault per rank in a list",
          "[unit][train]") {
  CHECK(parse_fault("1:5:kill@allreduce").kind == FaultKind::kill_allreduce);
  CHECK(parse_fault("1:5:kill@after").kind == FaultKind::kill_after);
  CHECK(parse_fault("1:5:kill@snapshot").kind == FaultKind::kill_snapshot);
  CHECK(parse_fault("1:5:kill@heal").kind == FaultKind::kill_heal);
  CHECK_THROWS_AS(parse_fault("1:5:kill@"), ddp::ConfigError);
  CHECK_THROWS_AS(parse_fault("1:5:kill@boundary"), ddp::ConfigError);
  const Fault f = parse_fault("2:9:kill@heal");
  CHECK(f.kills(FaultKind::kill_heal, 2, 9));
  CHECK_FALSE(f.kills(FaultKind::kill_heal, 2, 8));
  CHECK_FALSE(f.kills(FaultKind::kill_heal, 1, 9));
  CHECK_FALSE(f.kills(FaultKind::kill, 2, 9));

  const auto list = parse_faults("1:20:kill,2:20:kill@allreduce,1:30:hang");
  REQUIRE(list.size() == 3);
  CHECK(fault_for(list, 1).step == 20);  // the first naming the rank
  CHECK(fault_for(list, 2).kind == FaultKind::kill_allreduce);
  CHECK(fault_for(list, 0).rank == -1);  // none
  CHECK(parse_faults("").empty());
  CHECK_THROWS_WITH(parse_faults("1:2,"), "DDP_TRAIN_FAULT='1:2,': an empty fault");
  CHECK_THROWS_WITH(parse_faults(",1:2"), "DDP_TRAIN_FAULT=',1:2': an empty fault");
  CHECK_THROWS_WITH(parse_faults("1:2,x"), Catch::StartsWith("DDP_TRAIN_FAULT='x': expected"));
  std::string many = "0:0";
  for (std::size_t i = 1; i < kMaxFaults; ++i) many += ",0:" + std::to_string(i);
  CHECK(parse_faults(many).size() == kMaxFaults);
  CHECK_THROWS_WITH(parse_faults(many + ",1:1"), "DDP_TRAIN_FAULT: more than 64 faults");
}

TEST_CASE("progress lines: step, phase and the worker's clock, as the agent parses them",
          "[unit][train]") {
  using ddp::worker::format_progress_line;
  char buf[ddp::worker::kProgressLineMax];
  const auto line = [&](std::int64_t step, std::string_view phase, std::int64_t us) {
    return std::string(buf, format_progress_line(buf, step, phase, us));
  };
  CHECK(line(12, "compute", 1700000000000042) == "step=12 phase=compute t=1700000000.000042\n");
  CHECK(line(0, "allreduce", 999999) == "step=0 phase=allreduce t=0.999999\n");
  CHECK(line(7, "", -1) == "step=7\n");
  CHECK(line(7, "eval", -1) == "step=7 phase=eval\n");
  CHECK(line(INT64_MAX, std::string(200, 'p'), INT64_MAX) ==
        "step=9223372036854775807 phase=" + std::string(32, 'p') + " t=9223372036854.775807\n");
  CHECK(line(INT64_MAX, std::string(200, 'p'), INT64_MAX).size() <= ddp::worker::kProgressLineMax);
  std::string why;
  CHECK(ddp::worker::parse_progress_fd("17", &why) == 17);
  for (const char* bad : {"", "x", "3x", "-4", "2", "0"}) {
    why.clear();
    INFO(bad);
    CHECK_FALSE(ddp::worker::parse_progress_fd(bad, &why).has_value());
    CHECK_THAT(why, Catch::Contains("DDPRUN_PROGRESS_FD"));
  }
}

TEST_CASE("progress writer: one line per report, never blocks, stops when the agent is gone",
          "[unit][train]") {
  using ddp::worker::ProgressWriter;
  int p[2];
  REQUIRE(::pipe(p) == 0);  // blocking, as a user's descriptor might be: the writer fixes that
  std::string why;
  ProgressWriter w = ProgressWriter::open(p[1], &why);
  REQUIRE(w.on());
  CHECK(why.empty());
  CHECK((::fcntl(p[1], F_GETFL) & O_NONBLOCK) != 0);
  w.report(3, "compute");
  w.report(3, "allreduce");
  char got[256];
  const ssize_t n = ::read(p[0], got, sizeof got);
  REQUIRE(n > 0);
  const std::string text(got, static_cast<std::size_t>(n));
  CHECK(text.rfind("step=3 phase=compute t=", 0) == 0);
  CHECK(text.find("\nstep=3 phase=allreduce t=") != std::string::npos);
  CHECK(std::count(text.begin(), text.end(), '\n') == 2);
  CHECK(w.written() == 2);
  // A full pipe: lines are dropped, the call returns at once.
  for (int i = 0; i < 100000 && w.dropped() == 0; ++i) w.report(i, "compute");
  CHECK(w.dropped() == 1);
  CHECK(w.on());
  // The agent gone: EPIPE (SIGPIPE ignored, as ddp-train's main does) turns the writer off.
  struct sigaction ign {
  }, old{};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ign, &old);
  ::close(p[0]);
  w.report(4, "compute");
  ::sigaction(SIGPIPE, &old, nullptr);
  CHECK_FALSE(w.on());
  const auto written = w.written();
  w.report(5, "compute");  // off: nothing, not even a failed write
  CHECK(w.written() == written);
  ::close(p[1]);
  // Descriptors that cannot carry progress are refused with the reason.
  why.clear();
  CHECK_FALSE(ProgressWriter::open(p[1], &why).on());  // closed now
  CHECK(why == "DDPRUN_PROGRESS_FD=" + std::to_string(p[1]) +
                   " is not an open descriptor in this process");
  REQUIRE(::pipe(p) == 0);
  why.clear();
  CHECK_FALSE(ProgressWriter::open(p[0], &why).on());  // a read end
  CHECK(why == "DDPRUN_PROGRESS_FD=" + std::to_string(p[0]) + " is not open for writing");
  ::close(p[0]);
  ::close(p[1]);
  why.clear();
  CHECK_FALSE(ProgressWriter::from_env(std::nullopt, &why).on());
  CHECK(why.empty());  // unset: off, nothing to warn about
  CHECK_FALSE(ProgressWriter::from_env(std::string("nope"), &why).on());
  CHECK_THAT(why, Catch::Contains("DDPRUN_PROGRESS_FD 'nope'"));
}

TEST_CASE("options: each model trains with its reference recipe unless told otherwise",
          "[unit][train]") {
  const auto no_gpu = [] { return false; };
  const auto with = [&](const std::string& model, const std::string& optimizer = "",
                        std::optional<float> lr = std::nullopt) {
    TrainOptions o;
    ChoiceWords w;
    w.model = model;
    w.optimizer = optimizer;
    if (lr) {
      o.optimizer.lr = *lr;
      w.lr_given = true;
    }
    apply_choices(w, no_gpu, o);
    return o;
  };
  auto o = with("convnet");  // PyTorch's MNIST example
  CHECK(o.optimizer.kind == OptimizerKind::adadelta);
  CHECK(o.optimizer.lr == 1.0f);
  CHECK(o.lr_gamma == 0.7f);
  o = with("llama");  // the FSDP+TP recipe
  CHECK(o.optimizer.kind == OptimizerKind::adamw);
  CHECK(o.optimizer.lr == 3e-3f);
  CHECK(o.lr_gamma == 1.0f);
  for (const char* m : {"mlp", "autoencoder"}) {  // the Fashion-MNIST tutorials'
    o = with(m);
    CHECK(o.optimizer.kind == OptimizerKind::adam);
    CHECK(o.optimizer.lr == 1e-3f);
  }
  o = with("linear");  // the DDP tutorials'
  CHECK(o.optimizer.kind == OptimizerKind::sgd);
  CHECK(o.optimizer.lr == 1e-3f);
  o = with("llama", "sgd");  // another optimizer: torch.optim's rate, no schedule
  CHECK(o.optimizer.kind == OptimizerKind::sgd);
  CHECK(o.optimizer.lr == 1e-3f);
  o = with("mlp", "adadelta");
  CHECK(o.optimizer.lr == 1.0f);
  CHECK(o.lr_gamma == 1.0f);
  o = with("convnet", "adadelta", 0.5f);  // a given --lr wins, the schedule stays the recipe's
  CHECK(o.optimizer.lr == 0.5f);
  CHECK(o.lr_gamma == 0.7f);
  CHECK_THAT(recipes_text(), Catch::Contains("convnet: adadelta lr 1, lr-gamma 0.7") &&
                                 Catch::Contains("llama: adamw lr 0.003") &&
                                 Catch::Contains("mlp: adam lr 0.001") &&
                                 Catch::Contains("linear: sgd lr 0.001"));
}
