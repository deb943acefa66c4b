// .npy: round trips, byte-exact headers from the NumPy format spec, and every kind of bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "src/core/npy.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest {
namespace test_npy {

namespace fs = std::filesystem;

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// A tensor whose bytes are a fixed pattern (not the code under test).
Tensor patterned(Shape shape, DType dtype) {
  std::vector<std::byte> b(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((i * 37 + 11) & 0x7F);
  return Tensor::from_bytes(shape, dtype, b);
}

// magic + version 1.0 + little-endian u16 header length, as the spec lays them out.
std::string v1_prefix(std::uint16_t hlen) {
  return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(hlen & 0xFF) +
         static_cast<char>(hlen >> 8);
}
std::string v1_file(const std::string& header, const std::string& data) {
  return v1_prefix(static_cast<std::uint16_t>(header.size())) + header + data;
}

class NpyFiles : public ::testing::Test {
 protected:
  test_support::TempDir tmp_{"npy"};
  fs::path dir_ = tmp_.path();
};

TEST(Npy, RoundTripEveryDtypeRankAndEmpty) {
  const std::vector<Shape> shapes = {Shape{},        Shape{5},          Shape{2, 3},
                                     Shape{2, 3, 4}, Shape{1, 2, 3, 2}, Shape{0},
                                     Shape{3, 0},    Shape{2, 0, 4},    Shape{123456789012, 0}};
  for (DType t : kAllDTypes) {
    for (const Shape& s : shapes) {
      const Tensor x = patterned(s, t);
      const std::vector<std::byte> b = npy_bytes(x);
      EXPECT_EQ(b.size() % 64, x.nbytes() % 64) << "header not 64-aligned: " << s.str();
      EXPECT_TRUE(read_npy_bytes(b, "mem").bitwise_equal(x)) << dtype_name(t) << s.str();
    }
  }
}

// Expected bytes follow numpy/lib/format.py: dict, 21 - len(str(shape[0])) growth spaces
// (rank > 0), then spaces and '\n' so that magic + len + header is a multiple of 64.
TEST(Npy, HeaderIsByteExactWithNumpy) {
  const std::string f32_23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(f32_23.size(), 59u);
  const std::string f32_data(
      "\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40\x00\x00"
      "\xc0\x40",
      24);  // 1.0f .. 6.0f little-endian
  const std::string want = v1_prefix(118) + f32_23 + std::string(58, ' ') + "\n" + f32_data;
  ASSERT_EQ(want.size(), 128u + 24u);
  const Tensor x = Tensor::from_vector<float>(Shape{2, 3}, {1, 2, 3, 4, 5, 6});
  const std::vector<std::byte> got = npy_bytes(x);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.data()), got.size()), want);
  EXPECT_TRUE(read_npy_bytes(bytes_of(want), "want").bitwise_equal(x));

  struct Case {
    Tensor t;
    std::string dict;
    std::size_t spaces;
  };
  const Case cases[] = {
      {Tensor(Shape{5}, DType::i64), "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }",
       60},
      {Tensor(Shape{}, DType::f64), "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", 62},
      {Tensor(Shape{2}, DType::bf16),
       "{'descr': 'bfloat16', 'fortran_order': False, 'shape': (2,), }", 55},
      {Tensor(Shape{1000, 2}, DType::u8),
       "{'descr': '|u1', 'fortran_order': False, 'shape': (1000, 2), }", 55},
      // A long rank-6 header (the longest whose dims' product fits in int64, which Shape
      // requires): 20 growth spaces plus 3 of padding reach exactly 128 bytes.
      {Tensor(Shape{0, 1000000, 1000000, 1000000, 9, 1}, DType::bf16),
       "{'descr': 'bfloat16', 'fortran_order': False, 'shape': (0, 1000000, 1000000, 1000000, "
       "9, 1), }",
       23},
      {Tensor(Shape{3}, DType::i32), "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
       60},
      {Tensor(Shape{2}, DType::f16), "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }",
       60},
  };
  for (const Case& c : cases) {
    const std::string header = c.dict + std::string(c.spaces, ' ') + "\n";
    const std::string file = v1_file(header, std::string(c.t.nbytes(), '\0'));
    const std::vector<std::byte> got_c = npy_bytes(c.t);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(got_c.data()), got_c.size()), file)
        << c.dict;
  }
}

TEST(Npy, ReadsOtherWritersHeaders) {
  // Keys reordered, double quotes, no trailing comma, no padding; little-endian i32 1, -2.
  const std::string data("\x01\x00\x00\x00\xfe\xff\xff\xff", 8);
  const Tensor want = Tensor::from_vector<std::int32_t>(Shape{2}, {1, -2});
  const std::string v1 =
      v1_file("{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<i4\"}", data);
  EXPECT_TRUE(read_npy_bytes(bytes_of(v1), "v1").bitwise_equal(want));
  // Format 2.0: u32 header length.
  const std::string h2 = "{'descr': '<i4', 'fortran_order': False, 'shape': (2L,), }\n";
  const std::string v2 = std::string("\x93NUMPY\x02\x00", 8) + static_cast<char>(h2.size()) +
                         std::string(3, '\0') + h2 + data;
  EXPECT_TRUE(read_npy_bytes(bytes_of(v2), "v2").bitwise_equal(want));
  // '<V2' (np.save of an ml_dtypes.bfloat16 array) reads as bf16: 0x3f80 = 1.0, 0xc000 = -2.0.
  const std::string v2b = v1_file("{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }\n",
                                  std::string("\x80\x3f\x00\xc0", 4));
  const Tensor b = read_npy_bytes(bytes_of(v2b), "v2b");
  ASSERT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.item(0), 1.0);
  EXPECT_EQ(b.item(1), -2.0);
  // '<f2' (np.save of a float16 array): IEEE binary16, 0x3c00 = 1.0, 0xc000 = -2.0.
  const std::string v2h = v1_file("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }\n",
                                  std::string("\x00\x3c\x00\xc0", 4));
  const Tensor h = read_npy_bytes(bytes_of(v2h), "v2h");
  ASSERT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.item(0), 1.0);
  EXPECT_EQ(h.item(1), -2.0);
}

// Expects read_npy_bytes to throw an Error that names the source and contains `what`.
void expect_bad(const std::string& file, const std::string& what) {
  try {
    read_npy_bytes(bytes_of(file), "bad.npy");
    ADD_FAILURE() << "no error for " << what;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.npy"), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "want '" << what << "' in: " << msg;
  }
}

std::string dict(const std::string& descr, const std::string& order, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }\n";
}

TEST(Npy, BadInputGivesClearErrors) {
  const std::string ok_data(24, '\0');
  expect_bad("", "not a .npy file");
  expect_bad("\x93NUMPY", "not a .npy file");
  expect_bad(std::string("\x93NUMPZ\x01\x00\x00\x00", 10), "not a .npy file");
  expect_bad(std::string("PK\x03\x04 this is a zip", 19), "not a .npy file");
  expect_bad(std::string("\x93NUMPY\x04\x00\x00\x00\x00\x00", 12), "version 4.0");
  expect_bad(std::string("\x93NUMPY\x02\x00\x00\x00", 10), "truncated .npy");
  expect_bad(v1_prefix(200) + "{'descr': '<f4'", "truncated .npy header");
  expect_bad(v1_file(dict("<f4", "True", "(2, 3)"), ok_data), "Fortran order");
  for (const char* descr : {">f4", ">f2", "|b1", "<u2", "<c8", "O"}) {
    expect_bad(v1_file(dict(descr, "False", "(2, 3)"), ok_data),
               "is not supported (expected '<f4', '<f8', '<f2',");
  }
  // Headers that do not parse.
  for (const std::string& h :
       {std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), \n"),
        std::string("{'descr': '<f4', 'fortran_order': False}\n"),
        std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n"),
        std::string("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}"),
        dict("<f4", "Maybe", "(2, 3)"), dict("<f4", "False", "(2, three)"),
        dict("<f4", "False", "(2.0, 3)"), dict("<f4", "False", "[2, 3]"),
        dict("<f4", "False", "(99999999999999999999,)"), std::string("garbage\n"),
        std::string("{'descr: '<f4'}"), std::string("{'descr': '<f4', }} extra"),
        std::string("")}) {
    expect_bad(v1_file(h, ok_data), "header does not parse");
  }
  expect_bad(v1_file(dict("<f4", "False", "(2, 3)"), std::string(23, '\0')), "truncated .npy data");
  expect_bad(v1_file(dict("<f4", "False", "(2, 3)"), std::string(25, '\0')), "does not match");
  expect_bad(v1_file(dict("<f4", "False", "(2, 2)"), ok_data), "does not match");
  expect_bad(v1_file(dict("<f4", "False", "(-2, -3)"), ok_data), "invalid");
  expect_bad(v1_file(dict("<f8", "False", "(4294967296, 4294967296)"), ok_data), "invalid");
  expect_bad(v1_file(dict("<f4", "False", "(1, 1, 1, 1, 1, 1, 6)"), ok_data), "rank 7");
}

TEST(Npy, AbsurdShapesAreErrorsBeforeAnyAllocation) {
  // 2^62 one-byte elements with no data: the size check fails, nothing is allocated.
  expect_bad(v1_file(dict("|u1", "False", "(4611686018427387904,)"), ""),
             "needs 4611686018427387904 bytes, the file has 0");
  // A 0 dim makes the byte size 0, but the other dims' product still overflows int64.
  expect_bad(v1_file(dict("<f4", "False", "(0, 4611686018427387904, 4)"), ""), "overflows int64");
  // A v2.0 header length of 4 GiB - 1 in a 14-byte file.
  expect_bad(std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14),
             "header length 4294967295 needs 4294967307 bytes, the file has 14");
}

TEST_F(NpyFiles, WriteReadFilesAtomically) {
  const fs::path p = dir_ / "x.npy";
  const Tensor a = patterned(Shape{4, 5}, DType::f64);
  write_npy(p, a);
  EXPECT_TRUE(read_npy(p).bitwise_equal(a));
  const Tensor b = patterned(Shape{3}, DType::bf16);
  write_npy(p, b);  // overwrite
  EXPECT_TRUE(read_npy(p).bitwise_equal(b));
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1u) << "temp file left behind";
  // The file on disk is exactly npy_bytes.
  std::ifstream in(p, std::ios::binary);
  const std::string disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::byte> mem = npy_bytes(b);
  EXPECT_EQ(disk, std::string(reinterpret_cast<const char*>(mem.data()), mem.size()));
}

TEST_F(NpyFiles, UnreadableOrUnwritableFilesNameThePath) {
  const auto expect_error = [](auto&& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const fs::path missing = dir_ / "missing.npy";
  expect_error([&] { read_npy(missing); }, missing.string());
  expect_error([&] { read_npy(dir_); }, dir_.string());  // a directory
  const fs::path bad = dir_ / "bad.npy";
  std::ofstream(bad, std::ios::binary) << "not numpy";
  expect_error([&] { read_npy(bad); }, bad.string());
  const fs::path nodir = dir_ / "no" / "such" / "dir.npy";
  expect_error([&] { write_npy(nodir, Tensor(Shape{1}, DType::f32)); }, nodir.string());
}

}  // namespace test_npy
}  // namespace meshtest
