// .safetensors: mmap + header validation on open, sliced reads, and the atomic writer.
#include "src/core/safetensors.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "src/core/file.hpp"
#include "src/core/json.hpp"

namespace meshtest {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

using json = nlohmann::json;

struct DTypeName {
  std::string_view name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F32", DType::f32}, {"F64", DType::f64}, {"BF16", DType::bf16}, {"F16", DType::f16},
    {"I32", DType::i32}, {"I64", DType::i64}, {"U8", DType::u8}};

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

// Validates one header entry against a data buffer of `data_size` bytes.
TensorInfo parse_entry(const std::string& file, const std::string& name, const json& v,
                       std::uint64_t data_size) {
  const auto bad = [&](const std::string& what) {
    fail("'{}': tensor '{}': {} (entry {})", file, name, what, v.dump());
  };
  if (!v.is_object()) bad("entry is not a JSON object");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(field)) bad(fmt::format("missing field '{}'", field));
  }
  TensorInfo info;
  info.name = name;
  const json& dt = v.at("dtype");
  if (!dt.is_string()) bad("field 'dtype' is not a string");
  const std::string dt_name = dt.get<std::string>();
  const auto* known = std::find_if(std::begin(kDTypeNames), std::end(kDTypeNames),
                                   [&](const DTypeName& d) { return d.name == dt_name; });
  if (known == std::end(kDTypeNames)) {
    bad(fmt::format("dtype {} is not supported (expected one of F32, F64, BF16, F16, I32, I64, U8)",
                    dt.dump()));
  }
  info.dtype = known->dtype;

  const json& sh = v.at("shape");
  if (!sh.is_array() || sh.size() > static_cast<std::size_t>(Shape::kMaxRank)) {
    bad(fmt::format("field 'shape' must be an array of at most {} dims", Shape::kMaxRank));
  }
  std::vector<std::int64_t> dims;
  std::int64_t nbytes = static_cast<std::int64_t>(dtype_size(info.dtype));
  for (const json& d : sh) {
    if (!d.is_number_unsigned() ||
        d.get<std::uint64_t>() > std::numeric_limits<std::int64_t>::max() ||
        __builtin_mul_overflow(nbytes, d.get<std::int64_t>(), &nbytes)) {
      bad("field 'shape' must hold non-negative integers whose byte size fits in int64");
    }
    dims.push_back(d.get<std::int64_t>());
  }
  try {
    info.shape = Shape(dims);
  } catch (const Error& e) {
    bad(e.what());  // a product of the dims overflows (possible when one dim is 0)
  }

  const json& off = v.at("data_offsets");
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned()) {
    bad("field 'data_offsets' must be [begin, end] with non-negative integers");
  }
  info.begin = off[0].get<std::uint64_t>();
  info.end = off[1].get<std::uint64_t>();
  if (info.begin > info.end || info.end > data_size) {
    bad(
        fmt::format("data_offsets [{}, {}] out of range of the {}-byte data buffer (file "
                    "truncated?)",
                    info.begin, info.end, data_size));
  }
  if (info.end - info.begin != static_cast<std::uint64_t>(nbytes)) {
    bad(fmt::format("data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}", info.begin,
                    info.end, info.end - info.begin, info.shape, info.dtype, nbytes));
  }
  return info;
}

// Throws unless a file of `size` bytes can hold the 8-byte header length.
void check_length(const std::string& file, std::uint64_t size) {
  MESHTEST_CHECK(size >= 8, "'{}': {} bytes is too short for a .safetensors file (needs >= 8)",
                 file, size);
}

}  // namespace

std::string_view safetensors_dtype_name(DType t) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == t) return d.name;
  }
  fail("safetensors: no name for dtype {}", t);
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string file = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MESHTEST_CHECK(fd >= 0, "cannot open .safetensors file '{}': {}", file, std::strerror(errno));
  const FdCloser closer{fd};
  struct stat st {};
  MESHTEST_CHECK(::fstat(fd, &st) == 0, "cannot stat '{}': {}", file, std::strerror(errno));
  MESHTEST_CHECK(S_ISREG(st.st_mode), "'{}' is not a regular file", file);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  check_length(file, size);
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  MESHTEST_CHECK(m != MAP_FAILED, "cannot map '{}': {}", file, std::strerror(errno));

  SafetensorsFile f;
  f.path_ = path;
  f.map_ = std::shared_ptr<const std::byte>(
      static_cast<const std::byte*>(m),
      [size](const std::byte* p) { ::munmap(const_cast<std::byte*>(p), size); });
  f.parse_header(size);
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::span<const std::byte> bytes,
                                            const std::string& name) {
  check_length(name, bytes.size());
  const auto buf = std::make_shared<const std::vector<std::byte>>(bytes.begin(), bytes.end());
  SafetensorsFile f;
  f.path_ = name;
  f.map_ = std::shared_ptr<const std::byte>(buf, buf->data());  // shares ownership of buf
  f.parse_header(bytes.size());
  return f;
}

void SafetensorsFile::parse_header(std::uint64_t size) {
  const std::string file = path_.string();
  std::uint64_t n = 0;
  std::memcpy(&n, map_.get(), 8);
  MESHTEST_CHECK(n <= size - 8,
                 "'{}': header length {} runs past the end of the file ({} bytes, so at most {})",
                 file, n, size, size - 8);
  const auto* text = reinterpret_cast<const char*>(map_.get()) + 8;
  json header;
  try {
    header = json::parse(text, text + n, json_depth_limit("'" + file + "'"));
  } catch (const json::exception& e) {
    fail("'{}': the {}-byte header is not valid JSON: {}", file, n, e.what());
  }
  MESHTEST_CHECK(header.is_object(), "'{}': the header is not a JSON object", file);
  data_ = map_.get() + 8 + n;
  const std::uint64_t data_size = size - 8 - n;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      MESHTEST_CHECK(value.is_object(), "'{}': __metadata__ is not a JSON object", file);
      for (const auto& [k, v] : value.items()) {
        MESHTEST_CHECK(v.is_string(), "'{}': __metadata__ value of '{}' is not a string: {}", file,
                       k, v.dump());
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    tensors_.emplace(key, parse_entry(file, key, value, data_size));
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::vector<std::string> some;
    for (auto j = tensors_.begin(); j != tensors_.end() && some.size() < 5; ++j) {
      some.push_back(j->first);
    }
    fail("'{}': no tensor named '{}' (it has {} tensors: {}{})", path_.string(), name,
         tensors_.size(), fmt::join(some, ", "), tensors_.size() > some.size() ? ", ..." : "");
  }
  return it->second;
}

Tensor SafetensorsFile::read(std::string_view name) const {
  const TensorInfo& t = info(name);
  return Tensor::from_bytes(t.shape, t.dtype, {data_ + t.begin, t.end - t.begin});
}

Tensor SafetensorsFile::read_slice(std::string_view name, int dim, Range r) const {
  const TensorInfo& t = info(name);
  const int rank = t.shape.rank();
  MESHTEST_CHECK(dim >= -rank && dim < rank, "'{}': tensor '{}' {}: dim {} out of range",
                 path_.string(), name, t.shape, dim);
  const int d = dim < 0 ? dim + rank : dim;
  MESHTEST_CHECK(r.start >= 0 && r.size >= 0 && r.start + r.size <= t.shape[d],
                 "'{}': tensor '{}' {}: slice [{}, {}) out of range along dim {}", path_.string(),
                 name, t.shape, r.start, r.start + r.size, d);
  Tensor out(t.shape.with(d, r.size), t.dtype);
  const std::size_t inner = static_cast<std::size_t>(t.shape.inner(d)) * dtype_size(t.dtype);
  const std::size_t src_block = static_cast<std::size_t>(t.shape[d]) * inner;
  const std::size_t dst_block = static_cast<std::size_t>(r.size) * inner;
  if (dst_block == 0) return out;
  const std::byte* src = data_ + t.begin + static_cast<std::size_t>(r.start) * inner;
  const std::int64_t outer = t.shape.outer(d);
  for (std::int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.bytes() + o * dst_block, src + o * src_block, dst_block);
  }
  return out;
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MESHTEST_CHECK(name != "__metadata__" && !header.contains(name),
                   "write_safetensors '{}': tensor name '{}' is reserved or used twice",
                   path.string(), name);
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape().vec()},
                    {"data_offsets", json::array({offset, offset + t.nbytes()})}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t n = text.size();
  std::vector<std::span<const std::byte>> parts = {
      std::as_bytes(std::span(&n, 1)), std::as_bytes(std::span(text.data(), text.size()))};
  for (const auto& [name, t] : tensors) parts.emplace_back(t.bytes(), t.nbytes());
  write_file_atomic(path, parts);
}

}  // namespace meshtest
