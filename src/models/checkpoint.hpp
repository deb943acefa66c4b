// gpt-oss checkpoint directories: config.json + *.safetensors, MXFP4 expert weights, sliced reads.
//
// Tensor names (shapes with H heads, KV kv heads, d head_dim, E experts, I intermediate):
//   embedding.weight [vocab, hidden]          unembedding.weight [vocab, hidden]
//   norm.scale [hidden]
//   block.{n}.attn.norm.scale [hidden]        block.{n}.attn.qkv.weight [(H + 2 KV) d, hidden]
//   block.{n}.attn.qkv.bias [(H + 2 KV) d]    block.{n}.attn.sinks [H]
//   block.{n}.attn.out.weight [hidden, H d]   block.{n}.attn.out.bias [hidden]
//   block.{n}.mlp.norm.scale [hidden]         block.{n}.mlp.gate.weight [E, hidden]
//   block.{n}.mlp.gate.bias [E]               block.{n}.mlp.mlp1_weight [E, 2 I, hidden]
//   block.{n}.mlp.mlp1_bias [E, 2 I]          block.{n}.mlp.mlp2_weight [E, hidden, I]
//   block.{n}.mlp.mlp2_bias [E, hidden]
// A tensor is stored either plainly (bf16, f16, f32 or f64) or as MXFP4: "<name>.blocks" u8
// [..., n / 32, 16] and "<name>.scales" u8 [..., n / 32] (see src/ops/mxfp4.hpp). The shapes
// above are the logical (decoded) ones. A tensor may live in any of the directory's files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/safetensors.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"

namespace meshtest {

/// The *.safetensors files of a checkpoint directory (mapped, headers parsed) and which file
/// holds each stored tensor. Reads copy only what is asked for.
class CheckpointDir {
 public:
  /// Opens every *.safetensors file in `dir`; throws Error if `dir` is not a directory, has no
  /// such file, a file is corrupt (named), or two files hold the same tensor.
  static CheckpointDir open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  /// Stored tensor names (MXFP4 tensors appear as their .blocks and .scales), sorted.
  std::vector<std::string> stored_names() const;
  /// Whether `name` is stored plainly or as MXFP4.
  bool contains(std::string_view name) const;
  /// Whether `name` is stored as MXFP4 (both .blocks and .scales present, shapes checked).
  bool is_mxfp4(std::string_view name) const;
  /// The stored tensor `name` (plain, or a .blocks / .scales part) and its file; throws Error
  /// naming the tensor and listing what the checkpoint holds.
  const TensorInfo& info(std::string_view stored_name) const;
  const SafetensorsFile& file(std::string_view stored_name) const;
  /// The logical shape of `name` (decoded shape for MXFP4).
  Shape shape(std::string_view name) const;

 private:
  std::filesystem::path dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t, std::less<>> index_;  // stored name -> file
};

/// The whole tensor `name` converted to `dtype` (bf16, f16, f32 or f64); MXFP4 is decoded.
/// Throws Error naming the tensor if it is missing, not floating, or its MXFP4 parts mismatch.
Tensor read_tensor(const CheckpointDir& ckpt, std::string_view name, DType dtype);
/// Only [r.start, r.start + r.size) along `dim` of `name`, converted to `dtype`. For MXFP4 only
/// the blocks and scales covering the range are read (rows: exactly those; the last dim: the
/// 32-value blocks that overlap it). Equals read_tensor(...).slice(dim, r).
Tensor read_tensor_slice(const CheckpointDir& ckpt, std::string_view name, int dim, Range r,
                         DType dtype);

/// Reads `dir`/config.json. Fields, as the published gpt-oss config.json (the reference
/// ModelConfig): num_hidden_layers, num_experts, experts_per_token, vocab_size, hidden_size,
/// intermediate_size, swiglu_limit, head_dim, num_attention_heads, num_key_value_heads,
/// sliding_window, initial_context_length, rope_theta, rope_scaling_factor, rope_ntk_alpha,
/// rope_ntk_beta; all required, others ignored (swiglu_alpha and norm_eps keep their defaults).
/// Throws Error naming the file and the field that is missing, of the wrong type or invalid.
GptOssConfig read_config(const std::filesystem::path& dir);
/// Parses the text of a config.json as read_config does; `source` names it in messages.
GptOssConfig parse_config(std::string_view text, const std::string& source);
/// Writes those fields of `c` to `dir`/config.json (atomically; creates `dir`).
void write_config(const std::filesystem::path& dir, const GptOssConfig& c);

/// Throws Error naming the first tensor of blocks 0 .. num_layers-1 (and the model-level ones)
/// that is missing from `ckpt` or whose logical shape differs from the one `c` gives it
/// (expected vs given). Reads headers only; a sharded reader calls it before slicing.
void check_checkpoint_shapes(const CheckpointDir& ckpt, const GptOssConfig& c,
                             std::int64_t num_layers);
/// The dtype read_checkpoint reads `name` in: `compute`, except that with bf16 a norm scale
/// stored in f32 stays f32 (the reference keeps norm scales in f32).
DType checkpoint_read_dtype(const CheckpointDir& ckpt, std::string_view name, DType compute);

/// Options of read_checkpoint().
struct ReadCheckpointOptions {
  std::int64_t num_layers = -1;  ///< read only blocks 0 .. n-1; -1: all
};

/// Reads the weights of `c` from the checkpoint `dir` in `compute` dtype (bf16, f32 or f64);
/// MXFP4 tensors are decoded. Norm scales are read in `compute`, except that with bf16 a norm
/// scale stored in f32 stays f32 (the reference keeps norm scales in f32). With num_layers = n
/// the result has n blocks (run it with a config of num_hidden_layers = n).
/// Throws Error naming the tensor for a missing tensor (listing what is there), a shape other
/// than the config's (expected vs given), a non-floating dtype or mismatched MXFP4 parts.
TransformerWeights read_checkpoint(const std::filesystem::path& dir, const GptOssConfig& c,
                                   DType compute, const ReadCheckpointOptions& options = {});

/// Writes config.json and model.safetensors (tensors in the weights' dtypes; mlp1_weight and
/// mlp2_weight MXFP4-encoded when `mxfp4_experts`, which needs hidden and intermediate sizes
/// that are multiples of 32). Throws Error if `w` does not fit `c`.
void write_checkpoint(const std::filesystem::path& dir, const GptOssConfig& c,
                      const TransformerWeights& w, bool mxfp4_experts = true);

}  // namespace meshtest
