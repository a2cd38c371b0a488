// The MNIST convnet's pieces past the convolution itself (conv_gemm_test.cpp) and the layers'
// gradients (train_test.cpp): Adadelta against values torch.optim.Adadelta computed, the
// learning rate a StepLR schedule sets between steps, and the options that go with the convnet
// (--model convnet, --optimizer adadelta, --lr-gamma).
#include <catch2/catch.hpp>
#include <cmath>

#include "optimizer.hpp"
#include "options.hpp"

using namespace ddp::train;

TEST_CASE("Adadelta: torch.optim.Adadelta's values, state square_avg then acc_delta",
          "[unit][train]") {
  // torch 2.15: Adadelta([p], lr=1.0) (rho 0.9, eps 1e-6), two steps, then lr 0.5 (what a
  // StepLR would set) and a third.
  Optimizer opt({OptimizerKind::adadelta, 1.0f}, 2);
  REQUIRE(opt.state().size() == 4);
  float p[2] = {1.0f, -1.0f};
  const float g1[2] = {0.5f, -3.0f}, g2[2] = {0.25f, 1.0f};
  opt.step(p, g1);
  CHECK(p[0] == Approx(0.9968377947807312).epsilon(1e-6));
  CHECK(p[1] == Approx(-0.9968377351760864).epsilon(1e-6));
  CHECK(opt.state()[0] == Approx(0.025f).epsilon(1e-6));  // square_avg
  CHECK(opt.state()[1] == Approx(0.9f).epsilon(1e-6));
  CHECK(opt.state()[2] == Approx(9.999602070820401e-07).epsilon(1e-5));  // acc_delta
  CHECK(opt.state()[3] == Approx(9.999989742937032e-07).epsilon(1e-5));
  opt.step(p, g2);
  CHECK(p[0] == Approx(0.9947527050971985).epsilon(1e-6));
  CHECK(p[1] == Approx(-0.9983202219009399).epsilon(1e-6));
  CHECK(opt.state()[0] == Approx(0.028749998658895493).epsilon(1e-6));
  CHECK(opt.state()[3] == Approx(1.1197788580830093e-06).epsilon(1e-5));
  opt.set_lr(0.5f);
  CHECK(opt.config().lr == 0.5f);
  opt.step(p, g1);
  CHECK(p[0] == Approx(0.9930591583251953).epsilon(1e-6));
  CHECK(p[1] == Approx(-0.9966545104980469).epsilon(1e-6));
  CHECK(opt.steps() == 3);
}

TEST_CASE(
    "options: the convnet needs fashion-mnist and no mlp shape, --lr-gamma is above 0 and at most "
    "1",
    "[unit][train]") {
  TrainOptions o;
  ChoiceWords conv;
  conv.model = "convnet";
  conv.optimizer = "adadelta";
  apply_choices(
      conv, [] { return false; }, o);
  CHECK(o.model == ModelKind::convnet);
  CHECK(o.optimizer.kind == OptimizerKind::adadelta);
  CHECK(to_string(o.optimizer.kind) == "adadelta");
  CHECK_NOTHROW(validate(o));
  o.dataset = DatasetKind::synthetic;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("--model convnet with --dataset synthetic"));
  o.dataset = DatasetKind::fashion_mnist;
  o.hidden = 512;
  CHECK_THROWS_WITH(validate(o),
                    Catch::Contains("--hidden and --layers") && Catch::Contains("convnet"));
  o.hidden = 0;
  for (float gamma : {0.0f, -0.5f, 1.5f, std::nanf("")}) {
    o.lr_gamma = gamma;
    CHECK_THROWS_WITH(validate(o), Catch::Contains("--lr-gamma must be in (0, 1]"));
  }
  o.lr_gamma = 0.7f;
  CHECK_NOTHROW(validate(o));
  o.layers = 2;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("--layers") && Catch::Contains("convnet"));
}
