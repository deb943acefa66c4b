// .npy encoding and parsing (header dict, dtype descr, data size), and the atomic write.
#include "src/core/npy.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <string>

namespace meshtest {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kAlign = 64;             // numpy ARRAY_ALIGN
constexpr std::size_t kGrowthAxisDigits = 21;  // numpy GROWTH_AXIS_MAX_DIGITS

struct DescrName {
  std::string_view descr;
  DType dtype;
};
// The first entry of a dtype is what we write; all entries are accepted on read.
constexpr DescrName kDescrs[] = {
    {"<f4", DType::f32}, {"<f8", DType::f64},       {"<f2", DType::f16},
    {"<i4", DType::i32}, {"<i8", DType::i64},       {"|u1", DType::u8},
    {"<u1", DType::u8},  {"bfloat16", DType::bf16}, {"<V2", DType::bf16},
};

std::string_view descr_of(DType t) {
  for (const DescrName& d : kDescrs) {
    if (d.dtype == t) return d.descr;
  }
  fail("npy: no descr for dtype {}", t);
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// Parses the header's Python dict literal: {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), } with any whitespace, either quote, and optional trailing commas.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view name) : text_(text), name_(name) {}

  Header parse() {
    Header h;
    bool seen[3] = {false, false, false};
    expect('{');
    while (!eat('}')) {
      const std::string key = string_literal();
      expect(':');
      const int k = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
      if (k < 0) bad(fmt::format("unexpected key '{}'", key));
      if (seen[k]) bad(fmt::format("duplicate key '{}'", key));
      seen[k] = true;
      if (k == 0) h.descr = string_literal();
      if (k == 1) h.fortran_order = boolean();
      if (k == 2) h.shape = int_tuple();
      if (!eat(',')) {
        expect('}');
        break;
      }
    }
    skip_ws();
    if (pos_ != text_.size()) bad("characters after the closing '}'");
    if (!seen[0] || !seen[1] || !seen[2]) {
      bad("missing key (need 'descr', 'fortran_order' and 'shape')");
    }
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail("{}: .npy header does not parse: {} at byte {} of header {:?}", name_, what, pos_,
         std::string(text_));
  }
  void skip_ws() {
    while (pos_ < text_.size() && std::string_view(" \t\r\n").find(text_[pos_]) != npos) ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) bad(fmt::format("expected '{}'", c));
  }
  std::string string_literal() {
    skip_ws();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      bad("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == npos) bad("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_ws();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    bad("expected True or False");
  }
  std::vector<std::int64_t> int_tuple() {
    std::vector<std::int64_t> dims;
    expect('(');
    while (!eat(')')) {
      skip_ws();
      std::int64_t v = 0;
      const char* first = text_.data() + pos_;
      const auto [ptr, ec] = std::from_chars(first, text_.data() + text_.size(), v);
      if (ec != std::errc{}) bad("expected an integer that fits in int64");
      pos_ += static_cast<std::size_t>(ptr - first);
      eat('L');  // Python 2 long suffix
      dims.push_back(v);
      if (!eat(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }

  static constexpr std::size_t npos = std::string_view::npos;
  std::string_view text_;
  std::string_view name_;
  std::size_t pos_ = 0;
};

std::uint32_t read_le(const std::byte* p, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint32_t>(p[i]);
  return v;
}

// Header bytes as np.save writes them (numpy lib/format.py _write_array_header).
std::string npy_header(const Tensor& t) {
  std::string shape;
  for (int d = 0; d < t.rank(); ++d) shape += fmt::format("{}{}", d ? ", " : "", t.shape()[d]);
  if (t.rank() == 1) shape += ",";
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                 descr_of(t.dtype()), shape);
  if (t.rank() > 0) {  // room to grow axis 0 in place
    dict.append(kGrowthAxisDigits - std::to_string(t.shape()[0]).size(), ' ');
  }
  for (int version : {1, 2}) {
    const std::size_t len_bytes = version == 1 ? 2 : 4;
    const std::size_t hlen = dict.size() + 1;
    const std::size_t pad = kAlign - (kMagic.size() + 2 + len_bytes + hlen) % kAlign;
    const std::size_t total = hlen + pad;
    if (version == 1 && total > 0xFFFF) continue;
    std::string out(kMagic);
    out += static_cast<char>(version);
    out += '\0';
    for (std::size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((total >> (8 * i)) & 0xFF);
    out += dict;
    out.append(pad, ' ');
    out += '\n';
    return out;
  }
  fail("npy: header of {} bytes does not fit format 2.0", dict.size());
}

}  // namespace

Tensor read_npy_bytes(std::span<const std::byte> bytes, std::string_view name) {
  const std::size_t size = bytes.size();
  const auto* p = bytes.data();
  MESHTEST_CHECK(size >= 10 && std::memcmp(p, kMagic.data(), kMagic.size()) == 0,
                 "{}: not a .npy file (expected the magic \"\\x93NUMPY\" and 4 more bytes, "
                 "got {} bytes starting {:?})",
                 name, size,
                 std::string(reinterpret_cast<const char*>(p), std::min<std::size_t>(size, 8)));
  const int major = std::to_integer<int>(p[6]), minor = std::to_integer<int>(p[7]);
  MESHTEST_CHECK(major >= 1 && major <= 3,
                 "{}: .npy format version {}.{} is not supported (expected 1.0, 2.0 or 3.0)", name,
                 major, minor);
  const std::size_t prefix = major == 1 ? 10 : 12;
  MESHTEST_CHECK(size >= prefix, "{}: truncated .npy: {} bytes, the v{}.{} prefix needs {}", name,
                 size, major, minor, prefix);
  const std::size_t hlen = read_le(p + 8, major == 1 ? 2 : 4);
  MESHTEST_CHECK(hlen <= size - prefix,
                 "{}: truncated .npy header: header length {} needs {} bytes, the file has {}",
                 name, hlen, prefix + hlen, size);
  const Header h =
      HeaderParser(std::string_view(reinterpret_cast<const char*>(p) + prefix, hlen), name).parse();

  const auto* known = std::find_if(std::begin(kDescrs), std::end(kDescrs),
                                   [&](const DescrName& d) { return d.descr == h.descr; });
  MESHTEST_CHECK(known != std::end(kDescrs),
                 "{}: .npy dtype descr '{}' is not supported (expected '<f4', '<f8', '<f2', "
                 "'<i4', '<i8', '|u1', or 'bfloat16'/'<V2' for bf16)",
                 name, h.descr);
  MESHTEST_CHECK(!h.fortran_order,
                 "{}: .npy array is in Fortran order; only C order is supported "
                 "(save np.ascontiguousarray(a))",
                 name);
  MESHTEST_CHECK(h.shape.size() <= static_cast<std::size_t>(Shape::kMaxRank),
                 "{}: .npy shape has rank {}; the maximum is {}", name, h.shape.size(),
                 Shape::kMaxRank);
  std::int64_t nbytes = static_cast<std::int64_t>(dtype_size(known->dtype));
  for (std::int64_t d : h.shape) {
    MESHTEST_CHECK(d >= 0 && !__builtin_mul_overflow(nbytes, d, &nbytes),
                   "{}: .npy shape ({}) is invalid (negative dim or byte size overflows int64)",
                   name, fmt::join(h.shape, ", "));
  }
  Shape shape;
  try {
    shape = Shape(h.shape);  // also checks the products of the dims other than 0
  } catch (const Error& e) {
    fail("{}: .npy shape ({}) is invalid: {}", name, fmt::join(h.shape, ", "), e.what());
  }
  const std::size_t data = size - prefix - hlen;
  MESHTEST_CHECK(data >= static_cast<std::uint64_t>(nbytes),
                 "{}: truncated .npy data: shape ({}) of '{}' needs {} bytes, the file has {}",
                 name, fmt::join(h.shape, ", "), h.descr, nbytes, data);
  MESHTEST_CHECK(data == static_cast<std::uint64_t>(nbytes),
                 "{}: .npy data is {} bytes but shape ({}) of '{}' needs {} (element count "
                 "does not match the shape)",
                 name, data, fmt::join(h.shape, ", "), h.descr, nbytes);
  return Tensor::from_bytes(shape, known->dtype, bytes.subspan(prefix + hlen));
}

Tensor read_npy(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  MESHTEST_CHECK(!ec, "cannot read .npy file '{}': {}", path.string(), ec.message());
  std::ifstream in(path, std::ios::binary);
  MESHTEST_CHECK(in.good(), "cannot open .npy file '{}': {}", path.string(), std::strerror(errno));
  std::vector<std::byte> buf(size);
  in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(size));
  MESHTEST_CHECK(in.gcount() == static_cast<std::streamsize>(size),
                 "cannot read .npy file '{}': got {} of {} bytes", path.string(), in.gcount(),
                 size);
  return read_npy_bytes(buf, path.string());
}

std::vector<std::byte> npy_bytes(const Tensor& t) {
  const std::string header = npy_header(t);
  std::vector<std::byte> out(header.size() + t.nbytes());
  std::memcpy(out.data(), header.data(), header.size());
  if (t.nbytes() > 0) std::memcpy(out.data() + header.size(), t.bytes(), t.nbytes());
  return out;
}

void write_npy(const std::filesystem::path& path, const Tensor& t) {
  const std::string header = npy_header(t);
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span(header)),
                                              {t.bytes(), t.nbytes()}};
  write_file_atomic(path, parts);
}

}  // namespace meshtest
