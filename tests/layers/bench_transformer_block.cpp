// Tokens per second of one pre-norm Transformer encoder block, forward and backward, on
// the CPU: x + attn(LN(x)), then x + ffn(LN(x)), ffn = Dense(F) + ReLU + Dense(D), with
// random input and gradient. scripts/bench/transformer_block runs it beside the same block
// in PyTorch (scripts/bench/transformer_block_torch.py) with equal threads and shapes.
//
//   tnt_transformer_block_bench [--batch 8] [--length 64] [--hidden 512] [--heads 8]
//                               [--filter 2048] [--steps 10] [--warmup 2]
//
// Threads: TNT_NUM_THREADS. The last line is machine-readable: "RESULT
// framework=tarantella threads=T batch=B length=L ms_per_step=X tokens_per_s=Y".
#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>

namespace {

struct Args {
  int64_t batch = 8, length = 64, hidden = 512, heads = 8, filter = 2048, steps = 10, warmup = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw tnt::InputError(fmt::format("{} needs a value", flag));
    const std::string v = argv[++i];
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || n < 1) {
      throw tnt::InputError(fmt::format("{}: '{}' is not a positive integer", flag, v));
    }
    if (flag == "--batch") a.batch = n;
    else if (flag == "--length") a.length = n;
    else if (flag == "--hidden") a.hidden = n;
    else if (flag == "--heads") a.heads = n;
    else if (flag == "--filter") a.filter = n;
    else if (flag == "--steps") a.steps = n;
    else if (flag == "--warmup") a.warmup = n;
    else
      throw tnt::InputError(fmt::format(
          "unknown flag '{}' (flags: --batch --length --hidden --heads --filter --steps --warmup)", flag));
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [&] {
    using namespace tnt;
    const Args a = parse(argc, argv);
    SymTensor x = Input({a.length, a.hidden}, DType::f32, "x");  // (B, T, D)
    auto ln1 = std::make_shared<LayerNorm>(1e-6, "self_attn_norm");
    auto attn = std::make_shared<MultiHeadAttention>(a.hidden, MultiHeadAttentionOptions{.num_heads = a.heads},
                                                     "self_attn");
    auto ln2 = std::make_shared<LayerNorm>(1e-6, "ffn_norm");
    auto fc1 = std::make_shared<Dense>(a.filter, "ffn.linear1");
    auto fc2 = std::make_shared<Dense>(a.hidden, "ffn.linear2");
    SymTensor h = call(std::make_shared<Add>("res1"), std::vector<SymTensor>{x, call(attn, call(ln1, x))});
    SymTensor f = call(fc2, call(std::make_shared<ReLU>("relu"), call(fc1, call(ln2, h))));
    SymTensor y = call(std::make_shared<Add>("res2"), std::vector<SymTensor>{h, f});
    Network net({x}, {y}, "block");
    net.initialize(1);

    Tensor in = Tensor::empty({a.batch, a.length, a.hidden});
    Tensor dy = Tensor::empty({a.batch, a.length, a.hidden});
    CounterRng rng(1, "bench.block");
    for (int64_t i = 0; i < in.numel(); ++i) {
      in.data<float>()[i] = 2 * rng.uniform(static_cast<uint64_t>(i)) - 1;
      dy.data<float>()[i] = 2 * rng.uniform(static_cast<uint64_t>(i + in.numel())) - 1;
    }
    RunContext rc;
    rc.training = true;
    auto step = [&] {
      net.zero_grad();
      net.forward({in}, rc);
      net.backward({dy}, rc);
      ++rc.step;
    };
    for (int64_t s = 0; s < a.warmup; ++s) step();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < a.steps; ++s) step();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double ms = 1e3 * seconds / static_cast<double>(a.steps);
    const double tps = static_cast<double>(a.batch * a.length * a.steps) / seconds;
    print("block: hidden {}, heads {}, filter {}, {} parameters", a.hidden, a.heads, a.filter, net.parameter_count());
    print("RESULT framework=tarantella threads={} batch={} length={} ms_per_step={:.3f} tokens_per_s={:.1f}",
          num_threads(), a.batch, a.length, ms, tps);
  });
}
