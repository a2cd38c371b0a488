// Tests of ddp-train's --hidden / --layers: the mlp's shape from them, its parameter count, the
// bounds (named in the errors), and that a shaped model trains like the default one.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "ddp/proto/error.hpp"
#include "model.hpp"
#include "options.hpp"

using namespace ddp::train;

TEST_CASE("ddp-train --hidden and --layers shape the mlp", "[unit][train]") {
  const ModelSpec def = model_spec(ModelKind::mlp, 0, 0);
  REQUIRE(def.layers.size() == 3);
  CHECK(def.layers[0].out == 256);
  CHECK(param_count(def) == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);

  const ModelSpec deep = model_spec(ModelKind::mlp, 1024, 4);
  REQUIRE(deep.layers.size() == 5);
  for (int i = 0; i < 4; ++i) {
    CHECK(deep.layers[static_cast<std::size_t>(i)].out == 1024);
    CHECK(deep.layers[static_cast<std::size_t>(i)].act == Act::relu);
  }
  CHECK(deep.layers[0].in == 784);
  CHECK(deep.layers[4].in == 1024);
  CHECK(deep.layers[4].out == 10);
  CHECK(deep.loss == Loss::cross_entropy);
  CHECK(param_count(deep) == 784 * 1024 + 1024 + 3 * (1024 * 1024 + 1024) + 1024 * 10 + 10);
  CHECK(model_spec(ModelKind::mlp, 64, 0).layers.size() == 3);  // width only: two layers of it
  CHECK(model_spec(ModelKind::mlp, 0, 1).layers[0].out == 256);
  CHECK(model_spec(ModelKind::linear, 64, 3).layers.size() == 1);  // other kinds: as they are

  Model m(model_spec(ModelKind::mlp, 32, 3));
  CHECK(m.param_count() == param_count(m.spec()));
  m.init(1);
  std::vector<float> x(2 * 784, 0.5f);
  const float* y = m.forward(x.data(), 2);
  CHECK(std::isfinite(y[0]));
}

TEST_CASE("ddp-train's mlp shape is bounded, and only for the mlp", "[unit][train]") {
  TrainOptions o;
  o.model = ModelKind::mlp;
  o.hidden = 512;
  o.layers = 8;
  CHECK_NOTHROW(validate(o));
  o.layers = kMaxLayers + 1;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("--layers"));
  o.layers = -1;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("--layers"));
  o.layers = 2;
  o.hidden = kMaxHidden + 1;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("--hidden"));
  o.hidden = 65536;
  o.layers = 64;  // 2.7e11 parameters
  CHECK_THROWS_WITH(validate(o), Catch::Contains("parameters"));
  o.hidden = 64;
  o.layers = 2;
  o.model = ModelKind::autoencoder;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("mlp only"));
}
