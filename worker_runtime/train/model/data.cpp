// IDX parsing and the datasets of ddp-train (see data.hpp).
#include "data.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ddp/proto/error.hpp"

namespace ddp::train {

IdxArray parse_idx(std::string_view bytes, const std::string& name) {
  auto u8 = [&](std::size_t i) { return static_cast<std::uint8_t>(bytes[i]); };
  if (bytes.size() < 4)
    throw ConfigError(name + ": too short for an IDX header (" + std::to_string(bytes.size()) +
                      " bytes)");
  if (u8(0) != 0 || u8(1) != 0) throw ConfigError(name + ": not an IDX file (bad magic)");
  if (u8(2) != 0x08) {
    throw ConfigError(name + ": IDX element type 0x" + std::to_string(u8(2)) +
                      " is not supported (only unsigned bytes, 0x08)");
  }
  const std::size_t ndim = u8(3);
  if (ndim == 0 || ndim > 4)
    throw ConfigError(name + ": IDX rank " + std::to_string(ndim) + " is not 1 to 4");
  if (bytes.size() < 4 + 4 * ndim) throw ConfigError(name + ": truncated IDX header");
  IdxArray out;
  std::size_t total = 1;
  for (std::size_t d = 0; d < ndim; ++d) {
    const std::size_t o = 4 + 4 * d;
    const std::uint32_t v = (std::uint32_t{u8(o)} << 24) | (std::uint32_t{u8(o + 1)} << 16) |
                            (std::uint32_t{u8(o + 2)} << 8) | std::uint32_t{u8(o + 3)};
    out.dims.push_back(v);
    total *= v;
    if (total > (std::size_t{1} << 36)) throw ConfigError(name + ": IDX dimensions too large");
  }
  const std::size_t have = bytes.size() - (4 + 4 * ndim);
  if (have != total) {
    throw ConfigError(name + ": IDX data has " + std::to_string(have) + " bytes, the header says " +
                      std::to_string(total) + (have < total ? " (truncated file?)" : ""));
  }
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(4 + 4 * ndim), bytes.end());
  return out;
}

IdxArray read_idx_file(const std::string& path) {
  gzFile f = ::gzopen(path.c_str(), "rb");  // reads plain files too
  if (f == nullptr) {
    throw ConfigError(path + ": cannot open (" + std::strerror(errno) + ")");
  }
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const int n = ::gzread(f, buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      const std::string msg = ::gzerror(f, &code);
      ::gzclose(f);
      throw ConfigError(path + ": read error (" + msg + "): a corrupt gzip file?");
    }
    if (n == 0) break;
    bytes.append(buf, static_cast<std::size_t>(n));
  }
  ::gzclose(f);
  return parse_idx(bytes, path);
}

namespace {

std::string find_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) {
    throw ConfigError("--data " + dir +
                      ": not a folder (install Debian's dataset-fashion-mnist, "
                      "or point --data at the folder holding the IDX files)");
  }
  for (const char* ext : {".gz", ""}) {
    const std::string p = dir + "/" + stem + ext;
    if (fs::exists(p)) return p;
  }
  throw ConfigError("--data " + dir + ": " + stem + "[.gz] is missing");
}

}  // namespace

Dataset load_fashion_mnist(const std::string& dir, bool train, std::size_t limit) {
  const std::string split = train ? "train" : "t10k";
  const std::string img_path = find_file(dir, split + "-images-idx3-ubyte");
  const std::string lbl_path = find_file(dir, split + "-labels-idx1-ubyte");
  IdxArray images = read_idx_file(img_path);
  IdxArray labels = read_idx_file(lbl_path);
  if (images.dims.size() != 3)
    throw ConfigError(img_path + ": expected 3 dimensions (n, rows, cols)");
  if (labels.dims.size() != 1) throw ConfigError(lbl_path + ": expected 1 dimension");
  if (images.dims[0] != labels.dims[0]) {
    throw ConfigError(img_path + " has " + std::to_string(images.dims[0]) + " images but " +
                      lbl_path + " has " + std::to_string(labels.dims[0]) + " labels");
  }
  Dataset ds;
  ds.n = images.dims[0];
  if (limit > 0 && limit < ds.n) ds.n = limit;
  ds.dim = std::size_t{images.dims[1]} * images.dims[2];
  ds.classes = 10;
  ds.x.resize(ds.n * ds.dim);
  for (std::size_t i = 0; i < ds.x.size(); ++i) ds.x[i] = images.data[i] * (1.0f / 255.0f);
  ds.labels.assign(labels.data.begin(), labels.data.begin() + static_cast<std::ptrdiff_t>(ds.n));
  for (std::size_t i = 0; i < ds.n; ++i) {
    if (ds.labels[i] >= ds.classes) {
      throw ConfigError(lbl_path + ": label " + std::to_string(ds.labels[i]) + " of sample " +
                        std::to_string(i) + " is not a class 0..9");
    }
  }
  return ds;
}

Dataset make_synthetic(std::size_t n) {
  Dataset ds;
  ds.n = n;
  ds.dim = 20;
  ds.out_dim = 1;
  SplitMix64 rng(12345 + n);
  ds.x.resize(n * ds.dim);
  ds.y.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < ds.dim; ++j) ds.x[i * ds.dim + j] = rng.uniform();
    ds.y[i] = rng.uniform();
  }
  return ds;
}

}  // namespace ddp::train
