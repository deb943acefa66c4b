// .safetensors: round trips, sliced reads, byte layout, and every kind of bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>

#include "src/core/safetensors.hpp"
#include "tests/support/expect_error.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest {
namespace test_safetensors {

using test_support::expect_error;

namespace fs = std::filesystem;

// A tensor whose bytes are a fixed pattern (not the code under test).
Tensor patterned(Shape shape, DType dtype, int salt = 0) {
  std::vector<std::byte> b(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::byte>((i * 37 + 11 + static_cast<std::size_t>(salt)) & 0xFF);
  }
  return Tensor::from_bytes(shape, dtype, b);
}

// u64 little-endian length + header + data, as the format lays them out.
std::string st_file(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return out + header + data;
}

class Safetensors : public ::testing::Test {
 protected:
  fs::path put(const std::string& name, const std::string& bytes) const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  static std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  // Opening a file with `header` and `data` fails naming the file and containing `what`.
  void expect_bad(const std::string& header, const std::string& data, const std::string& what) {
    const fs::path p = put("bad.safetensors", st_file(header, data));
    expect_error([&] { SafetensorsFile::open(p); }, {p.string(), what});
  }

  test_support::TempDir tmp_{"safetensors"};
  fs::path dir_ = tmp_.path();
};

TEST_F(Safetensors, RoundTripEveryDtypeAndMetadata) {
  std::vector<std::pair<std::string, Tensor>> ts;
  const std::vector<Shape> shapes = {Shape{}, Shape{3}, Shape{2, 5}, Shape{0, 4}, Shape{2, 3, 4}};
  int salt = 0;
  for (DType t : kAllDTypes) {
    for (const Shape& s : shapes) {
      ts.emplace_back(fmt::format("{}.{}", dtype_name(t), s.str()), patterned(s, t, salt++));
    }
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}};
  const fs::path p = dir_ / "all.safetensors";
  write_safetensors(p, ts, meta);
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.names().size(), ts.size());
  for (const auto& [name, t] : ts) {
    EXPECT_EQ(f.info(name).dtype, t.dtype()) << name;
    EXPECT_EQ(f.info(name).shape, t.shape()) << name;
    EXPECT_TRUE(f.read(name).bitwise_equal(t)) << name;
  }
  // Without metadata there is no __metadata__ key; a copy of the file object outlives the original.
  write_safetensors(p, {{"x", ts[1].second}});
  EXPECT_EQ(slurp(p).find("__metadata__"), std::string::npos);
  std::optional<SafetensorsFile> copy;
  {
    const SafetensorsFile g = SafetensorsFile::open(p);
    copy = g;
  }
  EXPECT_TRUE(copy->metadata().empty());
  EXPECT_TRUE(copy->read("x").bitwise_equal(ts[1].second));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1)
      << "temp file left behind";
}

TEST_F(Safetensors, ReadSliceEqualsSliceOfFullForEveryDim) {
  std::vector<std::pair<std::string, Tensor>> ts;
  for (DType t : kAllDTypes) ts.emplace_back(dtype_name(t), patterned(Shape{3, 5, 7}, t));
  ts.emplace_back("vec", patterned(Shape{10}, DType::f32));
  ts.emplace_back("empty", patterned(Shape{4, 0, 2}, DType::bf16));
  const fs::path p = dir_ / "s.safetensors";
  write_safetensors(p, ts);
  const SafetensorsFile f = SafetensorsFile::open(p);
  for (const auto& [name, t] : ts) {
    for (int dim = 0; dim < t.rank(); ++dim) {
      for (int parts : {1, 2, 3, 4}) {
        for (int i = 0; i < parts; ++i) {
          const Range r = split_range(t.shape()[dim], parts, i);
          EXPECT_TRUE(f.read_slice(name, dim, r).bitwise_equal(t.slice(dim, r)))
              << name << " dim " << dim << " part " << i << "/" << parts;
        }
      }
      EXPECT_TRUE(f.read_slice(name, dim - t.rank(), {0, t.shape()[dim]}).bitwise_equal(t));
    }
  }
  expect_error([&] { f.read_slice("f32", 3, {0, 1}); }, {p.string(), "'f32'", "dim 3"});
  expect_error([&] { f.read_slice("f32", 1, {4, 2}); }, {p.string(), "out of range"});
  expect_error([&] { f.read_slice("f32", 0, {-1, 1}); }, {p.string(), "out of range"});
}

// The exact bytes: u64 LE header length, compact JSON with sorted keys, spaces to 8 bytes.
TEST_F(Safetensors, ByteLayoutIsExact) {
  const std::string json =
      R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  ASSERT_EQ(json.size(), 79u);
  const std::string want = std::string("\x50\0\0\0\0\0\0\0", 8) + json + " " +
                           std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);  // 1.0f, 2.0f
  const fs::path p = dir_ / "a.safetensors";
  write_safetensors(p, {{"a", Tensor::from_vector<float>(Shape{2}, {1.0f, 2.0f})}}, {{"k", "v"}});
  EXPECT_EQ(slurp(p), want);
}

TEST_F(Safetensors, ReadsOtherWritersFiles) {
  // Unsorted keys, whitespace, unpadded header, tensors out of buffer order, empty tensor.
  const std::string header = R"({ "b": {"dtype": "I32", "shape": [2], "data_offsets": [4, 12]},
    "a" : {"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},
    "e": {"dtype": "U8", "shape": [0, 3], "data_offsets": [12, 12]},
    "__metadata__": {"format": "pt"} })";
  const std::string data("\x80\x3f\x00\xc0\x07\x00\x00\x00\xf9\xff\xff\xff", 12);
  const SafetensorsFile f = SafetensorsFile::open(put("o.safetensors", st_file(header, data)));
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "e"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const Tensor a = f.read("a");
  EXPECT_EQ(a.dtype(), DType::bf16);
  EXPECT_EQ(a.shape(), (Shape{1, 2}));
  EXPECT_EQ(a.item(0), 1.0);
  EXPECT_EQ(a.item(1), -2.0);
  EXPECT_TRUE(f.read("b").bitwise_equal(Tensor::from_vector<std::int32_t>(Shape{2}, {7, -7})));
  EXPECT_EQ(f.read("e").shape(), (Shape{0, 3}));
  EXPECT_EQ(f.info("b").begin, 4u);
  EXPECT_EQ(f.info("b").end, 12u);
}

// F16 as other writers store it (IEEE binary16, little-endian), read and written back.
TEST_F(Safetensors, F16ReadsAndWritesIeeeHalf) {
  const std::string header = R"({"h": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}})";
  const std::string data("\x00\x3c\x00\xc0\xff\x7b\x01\x00", 8);  // 1, -2, 65504, 2^-24
  const SafetensorsFile f = SafetensorsFile::open(put("h.safetensors", st_file(header, data)));
  const Tensor h = f.read("h");
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.shape(), (Shape{2, 2}));
  EXPECT_EQ(h.item(0), 1.0);
  EXPECT_EQ(h.item(1), -2.0);
  EXPECT_EQ(h.item(2), 65504.0);
  EXPECT_EQ(h.item(3), std::ldexp(1.0, -24));
  const fs::path p = dir_ / "w.safetensors";
  write_safetensors(p, {{"h", h}});
  const std::string written = slurp(p);
  EXPECT_NE(written.find(R"("dtype":"F16")"), std::string::npos);
  EXPECT_EQ(written.substr(written.size() - 8), data);
  EXPECT_TRUE(SafetensorsFile::open(p).read("h").bitwise_equal(h));
}

TEST_F(Safetensors, BadFilesGiveClearErrors) {
  const std::string d8(8, '\0');
  const auto entry = [](const std::string& body) { return R"({"t": {)" + body + "}}"; };
  // Too short, header length past the end, JSON that does not parse or is not an object.
  expect_error([&] { SafetensorsFile::open(put("short", "abc")); }, {"short", "too short"});
  expect_error([&] { SafetensorsFile::open(put("empty", "")); }, {"empty", "too short"});
  const fs::path past = put("past", std::string("\x40\0\0\0\0\0\0\0{}", 10));
  expect_error([&] { SafetensorsFile::open(past); }, {past.string(), "runs past the end"});
  const fs::path huge = put("huge", std::string("\xff\xff\xff\xff\xff\xff\xff\xff{}", 10));
  expect_error([&] { SafetensorsFile::open(huge); }, {huge.string(), "runs past the end"});
  expect_bad(R"({"t": {"dtype": "F32",)", d8, "not valid JSON");
  expect_bad("", "", "not valid JSON");
  expect_bad("[1, 2]", "", "not a JSON object");
  expect_bad(R"({"t": 3})", d8, "not a JSON object");
  // Missing fields, unknown or mistyped dtype, bad shape.
  expect_bad(entry(R"("shape": [2], "data_offsets": [0, 8])"), d8, "missing field 'dtype'");
  expect_bad(entry(R"("dtype": "F32", "data_offsets": [0, 8])"), d8, "missing field 'shape'");
  expect_bad(entry(R"("dtype": "F32", "shape": [2])"), d8, "missing field 'data_offsets'");
  for (const char* dt : {R"("F8_E4M3")", R"("BOOL")", R"("f32")", R"("f16")"}) {
    expect_bad(entry(fmt::format(R"("dtype": {}, "shape": [4], "data_offsets": [0, 8])", dt)), d8,
               "is not supported (expected one of F32, F64, BF16, F16, I32, I64, U8)");
  }
  expect_bad(entry(R"("dtype": 32, "shape": [2], "data_offsets": [0, 8])"), d8, "not a string");
  for (const char* sh : {"[-2]", "[2.0]", "2", R"(["2"])", "[1, 1, 1, 1, 1, 1, 2]",
                         "[4294967296, 4294967296]", "[18446744073709551615]"}) {
    expect_bad(entry(fmt::format(R"("dtype": "F32", "shape": {}, "data_offsets": [0, 8])", sh)), d8,
               "'shape'");
  }
  // data_offsets: malformed, out of range, inconsistent with shape x dtype size.
  for (const char* off : {"[0]", "[0, 8, 16]", "[-1, 8]", "[0, 8.0]", "8"}) {
    expect_bad(entry(fmt::format(R"("dtype": "F32", "shape": [2], "data_offsets": {})", off)), d8,
               "'data_offsets'");
  }
  expect_bad(entry(R"("dtype": "F32", "shape": [2], "data_offsets": [8, 0])"), d8, "out of range");
  expect_bad(entry(R"("dtype": "F32", "shape": [2], "data_offsets": [4, 12])"), d8, "out of range");
  expect_bad(entry(R"("dtype": "F32", "shape": [3], "data_offsets": [0, 8])"), d8, "needs 12");
  expect_bad(entry(R"("dtype": "F64", "shape": [2], "data_offsets": [0, 8])"), d8, "needs 16");
  // Metadata that is not a string map.
  expect_bad(R"({"__metadata__": ["a"]})", "", "__metadata__");
  expect_bad(R"({"__metadata__": {"a": 1}})", "", "__metadata__");
}

TEST_F(Safetensors, AbsurdHeadersAreErrorsBeforeAnyAllocation) {
  const auto entry = [](const std::string& body) { return R"({"t": {)" + body + "}}"; };
  // 2^62 elements: the data offsets cannot hold them.
  expect_bad(entry(R"("dtype": "U8", "shape": [4611686018427387904], "data_offsets": [0, 8])"),
             std::string(8, '\0'), "hold 8 bytes, but shape [4611686018427387904] of u8 needs");
  // A 0 dim makes the byte size 0, but the other dims' product still overflows int64.
  expect_bad(
      entry(R"("dtype": "F32", "shape": [0, 4611686018427387904, 4], "data_offsets": [0, 0])"), "",
      "overflows int64");
  // JSON nested deeper than kMaxJsonDepth (each level would recurse when copied or printed):
  // the header object and 63 arrays in it are the most.
  const auto nested = [](int arrays) {
    return R"({"t": )" + std::string(arrays, '[') + std::string(arrays, ']') + "}";
  };
  expect_bad(nested(2000), "", "nests arrays and objects more than 64 deep");
  expect_bad(nested(64), "", "more than 64 deep");
  expect_bad(nested(63), "", "entry is not a JSON object");
}

TEST_F(Safetensors, FromBytesParsesLikeOpen) {
  const fs::path p = dir_ / "m.safetensors";
  write_safetensors(p, {{"w", patterned(Shape{2, 3}, DType::bf16)}}, {{"format", "pt"}});
  const std::string bytes = slurp(p);
  const SafetensorsFile f = SafetensorsFile::from_bytes(
      std::as_bytes(std::span(bytes.data(), bytes.size())), "in-memory");
  EXPECT_EQ(f.path(), "in-memory");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_TRUE(f.read("w").bitwise_equal(SafetensorsFile::open(p).read("w")));
  const std::string cut = bytes.substr(0, bytes.size() - 1);
  expect_error(
      [&] { SafetensorsFile::from_bytes(std::as_bytes(std::span(cut.data(), cut.size())), "cut"); },
      {"'cut'", "out of range"});
  expect_error([] { SafetensorsFile::from_bytes({}, "nothing"); }, {"'nothing'", "too short"});
}

TEST_F(Safetensors, TruncatedFileIsRejected) {
  const fs::path p = dir_ / "t.safetensors";
  write_safetensors(p, {{"w", patterned(Shape{4, 4}, DType::f32)}});
  const std::string full = slurp(p);
  for (std::size_t cut : {std::size_t{1}, std::size_t{63}, full.size() - 20, full.size() - 7}) {
    const fs::path q = put("cut.safetensors", full.substr(0, full.size() - cut));
    expect_error([&] { SafetensorsFile::open(q); }, {q.string()});
  }
}

TEST_F(Safetensors, MissingNamesAndUnreadableFiles) {
  const fs::path p = dir_ / "n.safetensors";
  std::vector<std::pair<std::string, Tensor>> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back(fmt::format("layer{}", i), Tensor(Shape{1}, DType::u8));
  write_safetensors(p, ts);
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_FALSE(f.contains("layer9"));
  expect_error([&] { f.read("layer9"); }, {p.string(), "'layer9'", "8 tensors", "layer0, layer1"});
  expect_error([&] { f.info("layer9"); }, {"no tensor named"});
  expect_error([&] { SafetensorsFile::open(dir_ / "missing"); }, {"missing", "No such file"});
  expect_error([&] { SafetensorsFile::open(dir_); }, {dir_.string(), "not a regular file"});
  // Writer errors: duplicate or reserved names, unwritable path.
  const Tensor x(Shape{1}, DType::f32);
  expect_error([&] { write_safetensors(dir_ / "d", {{"a", x}, {"a", x}}); }, {"'a'", "twice"});
  expect_error([&] { write_safetensors(dir_ / "d", {{"__metadata__", x}}); }, {"reserved"});
  const fs::path nodir = dir_ / "no" / "dir.safetensors";
  expect_error([&] { write_safetensors(nodir, {{"a", x}}); }, {nodir.string()});
}

}  // namespace test_safetensors
}  // namespace meshtest
