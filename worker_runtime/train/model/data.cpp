// IDX parsing and the datasets of ddp-train (see data.hpp).
#include "data.hpp"

#include <zlib.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "ddp/proto/error.hpp"

namespace ddp::train {

namespace {

// The header of an IDX file: its dimensions; the header's length is 4 + 4 x their count.
std::vector<std::uint32_t> parse_idx_header(std::string_view bytes, const std::string& name) {
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
  std::vector<std::uint32_t> dims;
  std::size_t total = 1;
  for (std::size_t d = 0; d < ndim; ++d) {
    const std::size_t o = 4 + 4 * d;
    const std::uint32_t v = (std::uint32_t{u8(o)} << 24) | (std::uint32_t{u8(o + 1)} << 16) |
                            (std::uint32_t{u8(o + 2)} << 8) | std::uint32_t{u8(o + 3)};
    dims.push_back(v);
    total *= v;
    if (total > (std::size_t{1} << 36)) throw ConfigError(name + ": IDX dimensions too large");
  }
  return dims;
}

std::size_t element_count(const std::vector<std::uint32_t>& dims) {
  std::size_t total = 1;
  for (auto d : dims) total *= d;
  return total;
}

[[noreturn]] void wrong_size(const std::string& name, std::size_t have, std::size_t total) {
  throw ConfigError(name + ": IDX data has " + std::to_string(have) + " bytes, the header says " +
                    std::to_string(total) + (have < total ? " (truncated file?)" : ""));
}

}  // namespace

IdxArray parse_idx(std::string_view bytes, const std::string& name) {
  IdxArray out;
  out.dims = parse_idx_header(bytes, name);
  const std::size_t head = 4 + 4 * out.dims.size();
  const std::size_t total = element_count(out.dims);
  if (bytes.size() - head != total) wrong_size(name, bytes.size() - head, total);
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(head), bytes.end());
  return out;
}

// Streams the file through zlib (plain files pass through), reading only the first `limit`
// items' bytes when a limit is given: a subset of Fashion-MNIST decompresses only its share.
IdxArray read_idx_file(const std::string& path, std::size_t limit) {
  gzFile f = ::gzopen(path.c_str(), "rb");  // reads plain files too
  if (f == nullptr) {
    throw ConfigError(path + ": cannot open (" + std::strerror(errno) + ")");
  }
  ::gzbuffer(f, 1 << 17);
  // Up to n bytes into `to`; the count read. Throws on a read error (a corrupt stream).
  const auto read = [&](char* to, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      const int r = ::gzread(f, to + got, chunk);
      if (r < 0) {
        int code = 0;
        const std::string msg = ::gzerror(f, &code);
        ::gzclose(f);
        throw ConfigError(path + ": read error (" + msg + "): a corrupt gzip file?");
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    return got;
  };
  char head[4 + 4 * 4];
  std::size_t have = read(head, 4);
  const std::size_t ndim = have == 4 ? static_cast<std::uint8_t>(head[3]) : 0;
  if (have == 4 && ndim >= 1 && ndim <= 4) have += read(head + 4, 4 * ndim);
  IdxArray out;
  try {
    out.dims = parse_idx_header(std::string_view(head, have), path);
  } catch (...) {
    ::gzclose(f);
    throw;
  }
  const std::size_t total = element_count(out.dims);
  const std::size_t item = out.dims[0] == 0 ? 0 : total / out.dims[0];
  const bool cut = limit > 0 && limit < out.dims[0];
  const std::size_t want = cut ? limit * item : total;
  out.data.resize(want);
  const std::size_t got = read(reinterpret_cast<char*>(out.data.data()), want);
  char extra = 0;
  const std::size_t beyond = cut || got < want ? 0 : read(&extra, 1);
  ::gzclose(f);
  if (got < want || beyond > 0) wrong_size(path, got + beyond, total);
  if (cut) out.dims[0] = static_cast<std::uint32_t>(limit);
  return out;
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
  IdxArray images = read_idx_file(img_path, limit);
  IdxArray labels = read_idx_file(lbl_path, limit);
  if (images.dims.size() != 3)
    throw ConfigError(img_path + ": expected 3 dimensions (n, rows, cols)");
  if (labels.dims.size() != 1) throw ConfigError(lbl_path + ": expected 1 dimension");
  if (images.dims[0] != labels.dims[0]) {
    throw ConfigError(img_path + " has " + std::to_string(images.dims[0]) + " images but " +
                      lbl_path + " has " + std::to_string(labels.dims[0]) + " labels");
  }
  Dataset ds;
  ds.n = images.dims[0];
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
