// meshtest-run dpsgd: one DP-SGD step on given weights and data (per-sample norms and the noisy
// clipped gradient), on one device or FSDP-sharded over the ranks of mpirun.
#include <fmt/format.h>
#include <mpi.h>
#include <boost/program_options.hpp>

#include <iostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dist/ccl/all_gather.hpp"
#include "dist/mesh/environment.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/fsdp.hpp"
#include "src/core/npy.hpp"
#include "src/core/safetensors.hpp"
#include "src/dp/dp_sgd.hpp"
#include "tools/mpi_subcommand.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::tools {
namespace run_dpsgd {

namespace po = boost::program_options;

// The model of SPEC with the weights of `path` (PyTorch nn.Sequential names, Linear weights
// out x in), converted to `dtype`. Every model parameter must be in the file and nothing else.
dp::Sequential load_model(const std::string& spec, std::int64_t in, DType dtype,
                          const std::string& path) {
  dp::Sequential m = dp::parse_model(spec, in, dtype);
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::set<std::string> unused;
  for (const std::string& n : file.names()) unused.insert(n);
  for (dp::Param* p : m.parameters()) {
    MESHTEST_CHECK(file.contains(p->name), "--weights {}: no tensor '{}' (the model '{}' needs it)",
                   path, p->name, spec);
    const TensorInfo& info = file.info(p->name);
    MESHTEST_CHECK(info.shape == p->shape && is_floating(info.dtype),
                   "--weights {}: '{}' is {}{}, expected a floating tensor of shape {}", path,
                   p->name, info.dtype, info.shape, p->shape);
    p->value = file.read(p->name).astype(dtype);
    unused.erase(p->name);
  }
  MESHTEST_CHECK(unused.empty(), "--weights {}: tensor '{}' is not a parameter of the model '{}'",
                 path, *unused.begin(), spec);
  return m;
}

int run(int argc, char** argv, const dist::Environment& env, MpiRunState& state) {
  po::options_description opts(
      "meshtest-run dpsgd: one DP-SGD step; writes the per-sample gradient norms and\n"
      "Σ_i c_i ∇θ ℓ_i (+ noise; ÷ B for mean), c_i = min(1, C / (‖∇θ ℓ_i‖ + 1e-6)).\n"
      "Under mpirun -np N the step runs FSDP-sharded (samples split by array_split)");
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("model", po::value<std::string>()->required(),
      "layers in order, e.g. linear:512,relu,linear:256,gelu,rmsnorm");
  add("weights", po::value<std::string>()->required(),
      ".safetensors with nn.Sequential names (0.weight, 0.bias, ...; Linear weight out x in)");
  add("inputs", po::value<std::string>()->required(), ".npy, B x d or B x T x d (f32 or f64)");
  add("targets", po::value<std::string>()->required(),
      ".npy: mse, the output's shape; ce, integer classes B or B x T");
  add("loss", po::value<std::string>()->default_value("mse"), "mse or ce");
  add("reduction", po::value<std::string>()->default_value("mean"), "mean or sum");
  add("mode", po::value<std::string>()->default_value("fused_bk"),
      "DP mode: hooks, ghost, fused or fused_bk (all give the same result)");
  add("clip", po::value<double>()->required(), "clip norm C > 0");
  add("out-norms", po::value<std::string>()->required(), "output .npy of the B per-sample norms");
  add("out-grads", po::value<std::string>()->required(), "output .safetensors of the gradient");
  add("noise", po::value<double>()->default_value(0.0), "noise multiplier sigma >= 0");
  add("seed", po::value<std::uint64_t>()->default_value(0), "noise seed");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  if (vm.count("help")) {
    if (env.rank() == 0) std::cout << opts << "\n";
    return 0;
  }
  po::notify(vm);

  const dp::DpSgdOptions opt{
      .mode = vm["mode"].as<std::string>(),
      .dp = {.clip = vm["clip"].as<double>(),
             .loss = dp::loss_from_name(vm["loss"].as<std::string>()),
             .reduction = dp::reduction_from_name(vm["reduction"].as<std::string>())},
      .noise = {.sigma = vm["noise"].as<double>(), .seed = vm["seed"].as<std::uint64_t>()},
      .optimizer = {}};
  MESHTEST_CHECK(dp::find_mode(opt.mode).name != "non_private",
                 "--mode non_private computes no per-sample norms (use hooks, ghost, fused or "
                 "fused_bk)");
  dp::check_noise(opt.noise, "--noise");
  const Tensor x = read_npy(vm["inputs"].as<std::string>());
  const Tensor y = read_npy(vm["targets"].as<std::string>());
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64,
                 "--inputs: dtype {}, expected f32 or f64", x.dtype());
  MESHTEST_CHECK(x.rank() == 2 || x.rank() == 3, "--inputs: shape {}, expected B x d or B x T x d",
                 x.shape());
  const dp::Sequential model = load_model(vm["model"].as<std::string>(), x.shape()[x.rank() - 1],
                                          x.dtype(), vm["weights"].as<std::string>());
  // The whole batch is checked on every rank before any communication: all fail alike.
  dp::check_batch(model, x, y, opt.dp);
  check_outputs_writable({vm["out-norms"].as<std::string>(), vm["out-grads"].as<std::string>()},
                         env.rank());

  state.communicating = true;
  const dist::MeshDevice mesh = dist::MeshDevice::line();
  const std::int64_t batch = x.shape()[0];
  Tensor norms;
  std::vector<Tensor> grads;
  if (mesh.size() == 1) {
    dp::PrivateModel pm(model, opt.mode, opt.dp);
    dp::DpGrads g = pm.compute(x, y);
    dp::add_step_noise(g.grads, 0, opt, batch);
    norms = std::move(g.norms);
    grads = std::move(g.grads);
  } else {
    const Range mine = split_range(batch, mesh.size(), mesh.device_id());
    dist::FsdpDpSgd fsdp(mesh, model, opt);
    dist::FsdpDpSgd::NoisyGrads g = fsdp.noisy_grads(x.slice(0, mine), y.slice(0, mine));
    norms = dist::all_gather(mesh, g.report.norms, {.dim = 0});
    const auto params = model.parameters();
    for (std::size_t p = 0; p < params.size(); ++p) {
      grads.push_back(
          dist::all_gather(mesh, g.shard_grads[p], {.dim = 0}).reshape(params[p]->shape));
    }
  }
  if (mesh.device_id() == 0) {
    write_npy(vm["out-norms"].as<std::string>(), norms);
    std::vector<std::pair<std::string, Tensor>> named;
    const auto params = model.parameters();
    for (std::size_t p = 0; p < params.size(); ++p) named.emplace_back(params[p]->name, grads[p]);
    write_safetensors(vm["out-grads"].as<std::string>(), named,
                      {{"mode", opt.mode}, {"clip", fmt::format("{}", opt.dp.clip)}});
    fmt::print("dpsgd: mode {} on {} device(s), B = {}, C = {}, sigma = {}: wrote {} and {}\n",
               opt.mode, mesh.size(), batch, opt.dp.clip, opt.noise.sigma,
               vm["out-norms"].as<std::string>(), vm["out-grads"].as<std::string>());
  }
  return 0;
}

int dpsgd_main(int argc, char** argv) {
  return mpi_subcommand("meshtest-run dpsgd", argc, argv, run);
}

const RegisterSubcommand reg{
    {"dpsgd", "one DP-SGD step on your weights and data (norms, gradient)", &dpsgd_main}};

}  // namespace run_dpsgd
}  // namespace meshtest::tools
