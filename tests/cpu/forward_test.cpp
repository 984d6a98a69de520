// The CPU executor's forward pass on tiny random models, against a naive reference forward written
// here (contiguous KV, no paging, no batching, double accumulation), and the paging invariances:
// chunking, block placement, batching, copies and swaps must not change a sequence's logits.
// Weight types: every type the kernels compute natively (K-quants on a wider model whose rows are
// whole 256-value super-blocks) and a mixed-type model (tests/support/ggml_encode.hpp encoders).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/base/error.hpp"
#include "engine/model/ggml_types.hpp"
#include "tests/support/ggml_encode.hpp"
#include "tests/support/step_slices.hpp"

namespace tessera {
namespace {

// ---- a tiny model with owned weights -----------------------------------------------------------

struct owned_buffers {
  std::vector<std::vector<std::byte>> bufs;
};

// Test-side encoders (ggml block layouts), independent of the executor's code.
using test_support::encode_row;

struct tiny_options {
  rope_style rope = rope_style::interleaved;
  int32_t rope_dims = 16;
  ggml_type matrix_type = ggml_type::f32;
  ggml_type embed_type = ggml_type::f32;
  bool tied = false;
  uint32_t seed = 7;
  bool wide = false;   // hidden 256, ffn 512, head_dim 64: rows of whole K-quant super-blocks
  bool mixed = false;  // per-tensor types from mixed_types (implies wide)
};

// A mixed-type file: like llama.cpp's Q4_K_M (Q4_K with Q6_K for some tensors, legacy types where
// a row is no whole super-block) plus every other type once, so that each fused input (Q|K|V,
// gate|up) feeds matrices of several activation formats in one step. Per layer: wq wk wv wo gate up down.
constexpr ggml_type mixed_types[2][7] = {
    {ggml_type::q4_k, ggml_type::q5_0, ggml_type::q6_k, ggml_type::q4_k, ggml_type::q3_k, ggml_type::q5_k,
     ggml_type::q6_k},
    {ggml_type::q2_k, ggml_type::q8_0, ggml_type::bf16, ggml_type::f16, ggml_type::q4_1, ggml_type::q5_1,
     ggml_type::q4_0},
};

std::shared_ptr<const model_weights> make_tiny_model(const tiny_options& o) {
  auto owned = std::make_shared<owned_buffers>();
  auto w = std::make_shared<model_weights>();
  model_config& c = w->config;
  c.name = "tiny";
  const bool wide = o.wide || o.mixed;
  c.num_layers = 2;
  c.hidden_size = wide ? 256 : 64;
  c.intermediate_size = wide ? 512 : 128;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = wide ? 64 : 16;
  c.vocab_size = 100;
  c.context_length = 256;
  c.rope_dims = o.rope_dims;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-5f;
  c.rope = o.rope;
  c.tied_embeddings = o.tied;
  std::mt19937 rng(o.seed);
  auto make = [&](const char* name, ggml_type type, int64_t rows, int64_t cols, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> vals(static_cast<size_t>(rows * cols));
    for (float& v : vals) v = u(rng);
    std::vector<std::byte> bytes;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<std::byte> row = encode_row(type, vals.data() + r * cols, cols);
      bytes.insert(bytes.end(), row.begin(), row.end());
    }
    owned->bufs.push_back(std::move(bytes));
    weight_tensor t;
    t.name = name;
    t.type = type;
    t.rows = rows;
    t.cols = cols;
    t.data = owned->bufs.back().data();
    t.row_stride_bytes = row_bytes(type, cols);
    return t;
  };
  const int64_t h = c.hidden_size, kv = c.num_kv_heads * c.head_dim, f = c.intermediate_size;
  const ggml_type mt = o.matrix_type;
  // Weights shrink as the model widens, so that activations keep about the same scale.
  const float s = wide ? 0.5f : 1.0f;
  w->token_embedding = make("token_embd", o.mixed ? ggml_type::q4_k : o.embed_type, c.vocab_size, h, -1.0f, 1.0f);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    auto type = [&](int i) { return o.mixed ? mixed_types[l % 2][i] : mt; };
    layer_weights lw;
    lw.attn_norm = make("attn_norm", ggml_type::f32, 1, h, 0.8f, 1.2f);
    lw.wq = make("wq", type(0), h, h, -0.25f * s, 0.25f * s);
    lw.wk = make("wk", type(1), kv, h, -0.25f * s, 0.25f * s);
    lw.wv = make("wv", type(2), kv, h, -0.25f * s, 0.25f * s);
    lw.wo = make("wo", type(3), h, h, -0.2f * s, 0.2f * s);
    lw.ffn_norm = make("ffn_norm", ggml_type::f32, 1, h, 0.8f, 1.2f);
    lw.w_gate = make("w_gate", type(4), f, h, -0.2f * s, 0.2f * s);
    lw.w_up = make("w_up", type(5), f, h, -0.2f * s, 0.2f * s);
    lw.w_down = make("w_down", type(6), h, f, -0.15f * s, 0.15f * s);
    w->layers.push_back(lw);
  }
  w->output_norm = make("output_norm", ggml_type::f32, 1, h, 0.8f, 1.2f);
  w->output = o.tied ? w->token_embedding
                     : make("output", o.mixed ? ggml_type::q6_k : mt, c.vocab_size, h, -0.3f * s, 0.3f * s);
  w->storage = owned;
  return w;
}

// ---- the naive reference forward -----------------------------------------------------------------

std::vector<double> dequant(const weight_tensor& t) {
  std::vector<float> f(static_cast<size_t>(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r) dequantize_row(t.type, t.row(r), f.data() + r * t.cols, t.cols);
  return {f.begin(), f.end()};
}

// logits[p] for every position p of `tokens`, computed one position at a time.
std::vector<std::vector<double>> reference_forward(const model_weights& w, const std::vector<token_id>& tokens) {
  const model_config& c = w.config;
  const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads, F = c.intermediate_size;
  const double eps = c.rms_norm_eps;
  auto matvec = [](const std::vector<double>& m, const std::vector<double>& x, int64_t rows) {
    const auto cols = static_cast<int64_t>(x.size());
    std::vector<double> y(static_cast<size_t>(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k)
        y[static_cast<size_t>(r)] += m[static_cast<size_t>(r * cols + k)] * x[static_cast<size_t>(k)];
    }
    return y;
  };
  auto norm = [&](const std::vector<double>& x, const std::vector<double>& g) {
    double ss = 0.0;
    for (double v : x) ss += v * v;
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * g[i];
    return y;
  };
  auto rope = [&](double* v, int64_t pos) {
    const int64_t half = c.rope_dims / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(static_cast<double>(c.rope_theta), -2.0 * static_cast<double>(i) / c.rope_dims);
      const double a = static_cast<double>(pos) * freq;
      const int64_t i0 = c.rope == rope_style::interleaved ? 2 * i : i;
      const int64_t i1 = c.rope == rope_style::interleaved ? 2 * i + 1 : i + half;
      const double x0 = v[i0], x1 = v[i1];
      v[i0] = x0 * std::cos(a) - x1 * std::sin(a);
      v[i1] = x0 * std::sin(a) + x1 * std::cos(a);
    }
  };
  struct layer {
    std::vector<double> an, fn, wq, wk, wv, wo, wg, wu, wd;
    std::vector<std::vector<double>> kcache, vcache;  // [pos][nkv*hd]
  };
  std::vector<layer> layers;
  for (const layer_weights& lw : w.layers) {
    layers.push_back({dequant(lw.attn_norm),
                      dequant(lw.ffn_norm),
                      dequant(lw.wq),
                      dequant(lw.wk),
                      dequant(lw.wv),
                      dequant(lw.wo),
                      dequant(lw.w_gate),
                      dequant(lw.w_up),
                      dequant(lw.w_down),
                      {},
                      {}});
  }
  const std::vector<double> emb = dequant(w.token_embedding), onorm = dequant(w.output_norm);
  const std::vector<double> out = dequant(w.output.empty() ? w.token_embedding : w.output);
  std::vector<std::vector<double>> logits;
  for (size_t p = 0; p < tokens.size(); ++p) {
    std::vector<double> x(emb.begin() + tokens[p] * H, emb.begin() + (tokens[p] + 1) * H);
    for (layer& L : layers) {
      const std::vector<double> xn = norm(x, L.an);
      std::vector<double> q = matvec(L.wq, xn, nh * hd), k = matvec(L.wk, xn, nkv * hd), v = matvec(L.wv, xn, nkv * hd);
      for (int64_t h = 0; h < nh; ++h) rope(q.data() + h * hd, static_cast<int64_t>(p));
      for (int64_t h = 0; h < nkv; ++h) rope(k.data() + h * hd, static_cast<int64_t>(p));
      L.kcache.push_back(k);
      L.vcache.push_back(v);
      std::vector<double> attn(static_cast<size_t>(nh * hd), 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t kh = h / (nh / nkv);
        std::vector<double> s(p + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= p; ++j) {
          double d = 0.0;
          for (int64_t i = 0; i < hd; ++i)
            d += q[static_cast<size_t>(h * hd + i)] * L.kcache[j][static_cast<size_t>(kh * hd + i)];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= p; ++j) {
          for (int64_t i = 0; i < hd; ++i)
            attn[static_cast<size_t>(h * hd + i)] += s[j] / sum * L.vcache[j][static_cast<size_t>(kh * hd + i)];
        }
      }
      const std::vector<double> o = matvec(L.wo, attn, H);
      for (int64_t i = 0; i < H; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
      const std::vector<double> xn2 = norm(x, L.fn);
      const std::vector<double> g = matvec(L.wg, xn2, F), u = matvec(L.wu, xn2, F);
      std::vector<double> m(static_cast<size_t>(F));
      for (int64_t i = 0; i < F; ++i)
        m[static_cast<size_t>(i)] =
            g[static_cast<size_t>(i)] / (1.0 + std::exp(-g[static_cast<size_t>(i)])) * u[static_cast<size_t>(i)];
      const std::vector<double> d = matvec(L.wd, m, H);
      for (int64_t i = 0; i < H; ++i) x[static_cast<size_t>(i)] += d[static_cast<size_t>(i)];
    }
    logits.push_back(matvec(out, norm(x, onorm), c.vocab_size));
  }
  return logits;
}

// ---- driving the executor ----------------------------------------------------------------------

std::vector<token_id> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<token_id> u(0, 99);
  std::vector<token_id> t(n);
  for (auto& x : t) x = u(rng);
  return t;
}

sequence_slice slice(uint64_t id, std::vector<token_id> tokens, int32_t num_computed, std::vector<block_id> table,
                     sequence_slice::logits_mode mode = sequence_slice::logits_mode::all) {
  return test_support::make_slice(id, std::move(tokens), num_computed, std::move(table), mode);
}

// Runs `tokens` through `ex` in steps of the given chunk sizes (cycled), returning every row.
std::vector<std::vector<float>> run_chunked(executor& ex, const std::vector<token_id>& tokens,
                                            const std::vector<block_id>& table, const std::vector<int>& chunks) {
  std::vector<std::vector<float>> rows;
  size_t done = 0;
  for (size_t c = 0; done < tokens.size(); ++c) {
    const size_t n = std::min(tokens.size() - done, static_cast<size_t>(chunks[c % chunks.size()]));
    step_batch b;
    b.seqs.push_back(slice(1, {tokens.begin() + static_cast<long>(done), tokens.begin() + static_cast<long>(done + n)},
                           static_cast<int32_t>(done), table));
    step_output out;
    ex.execute(b, out);
    EXPECT_EQ(out.num_rows.at(0), static_cast<int32_t>(n));
    for (int32_t r = 0; r < out.num_rows[0]; ++r) {
      const auto row = out.row(out.first_row[0] + r);
      rows.emplace_back(row.begin(), row.end());
    }
    done += n;
  }
  return rows;
}

std::vector<block_id> iota_table(int32_t first, int32_t n) {
  std::vector<block_id> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

double max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].size(), b[i].size());
    for (size_t j = 0; j < std::min(a[i].size(), b[i].size()); ++j)
      m = std::max(m, std::fabs(static_cast<double>(a[i][j]) - b[i][j]));
  }
  return m;
}

cpu_executor_options opts(int threads, int32_t block_size = 4, int32_t device = 64, int32_t host = 16,
                          const char* kernels = "", cpu_kv_dtype kv = cpu_kv_dtype::automatic) {
  cpu_executor_options o;
  o.kv_dtype = kv;
  o.num_threads = threads;
  o.kv.block_size = block_size;
  o.kv.num_device_blocks = device;
  o.kv.num_host_blocks = host;
  o.kernels = kernels;
  return o;
}

// ---- reference comparisons -----------------------------------------------------------------------

struct reference_case {
  const char* name;
  tiny_options model;
  const char* kernels;
  double tolerance;  // relative to the largest |logit|
  // fp32 unless the case is about the cache's rounding: the naive forward keeps K and V in double.
  cpu_kv_dtype kv = cpu_kv_dtype::fp32;
};

void PrintTo(const reference_case& c, std::ostream* os) { *os << c.name; }

class forward_vs_reference : public ::testing::TestWithParam<reference_case> {};

TEST_P(forward_vs_reference, prefill_then_decode_matches_naive_forward) {
  const reference_case& rc = GetParam();
  const auto w = make_tiny_model(rc.model);
  const std::vector<token_id> tokens = random_tokens(23, 11);
  const auto ref = reference_forward(*w, tokens);
  auto ex = make_cpu_executor(w, opts(2, 4, 16, 0, rc.kernels, rc.kv));
  const std::vector<block_id> table = {3, 9, 0, 15, 4, 7};
  // Prefill 17 tokens (all rows), then decode the rest one at a time (last row).
  std::vector<std::vector<float>> got = run_chunked(*ex, {tokens.begin(), tokens.begin() + 17}, table, {17});
  for (size_t p = 17; p < tokens.size(); ++p) {
    step_batch b;
    b.seqs.push_back(slice(1, {tokens[p]}, static_cast<int32_t>(p), table, sequence_slice::logits_mode::last));
    step_output out;
    ex->execute(b, out);
    ASSERT_EQ(out.num_rows[0], 1);
    ASSERT_EQ(out.vocab_size, 100);
    got.emplace_back(out.row(out.first_row[0]).begin(), out.row(out.first_row[0]).end());
  }
  ASSERT_EQ(got.size(), ref.size());
  double scale = 0.0, err = 0.0;
  for (size_t p = 0; p < ref.size(); ++p) {
    for (size_t v = 0; v < ref[p].size(); ++v) {
      scale = std::max(scale, std::fabs(ref[p][v]));
      err = std::max(err, std::fabs(ref[p][v] - got[p][v]));
    }
  }
  EXPECT_GT(scale, 0.5);  // the model is not degenerate
  EXPECT_LE(err, rc.tolerance * scale) << "max abs error " << err << " at logit scale " << scale;
  if (rc.tolerance > 1e-3) {
    // Quantized activations: also require that the argmax agrees at most positions.
    int agree = 0;
    for (size_t p = 0; p < ref.size(); ++p) {
      const auto a = std::max_element(ref[p].begin(), ref[p].end()) - ref[p].begin();
      const auto b = std::max_element(got[p].begin(), got[p].end()) - got[p].begin();
      agree += a == b;
    }
    EXPECT_GE(agree, static_cast<int>(ref.size()) - 2);
  }
}

tiny_options model(rope_style r, int32_t rope_dims, ggml_type mt, ggml_type et, bool tied) {
  tiny_options o;
  o.rope = r;
  o.rope_dims = rope_dims;
  o.matrix_type = mt;
  o.embed_type = et;
  o.tied = tied;
  return o;
}

// The wide model (rows of whole K-quant super-blocks) with every matrix of type `mt`.
tiny_options wide_model(ggml_type mt, rope_style r = rope_style::interleaved) {
  tiny_options o = model(r, 16, mt, ggml_type::q8_0, false);
  o.wide = true;
  return o;
}

tiny_options mixed_model() {
  tiny_options o;
  o.mixed = true;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    cases, forward_vs_reference,
    ::testing::Values(
        reference_case{"f32_interleaved", model(rope_style::interleaved, 16, ggml_type::f32, ggml_type::f32, false), "",
                       2e-5},
        reference_case{"f32_half", model(rope_style::half, 16, ggml_type::f32, ggml_type::f32, false), "", 2e-5},
        reference_case{"f32_half_partial_rope", model(rope_style::half, 8, ggml_type::f32, ggml_type::f32, false), "",
                       2e-5},
        reference_case{"f32_interleaved_partial_rope_scalar",
                       model(rope_style::interleaved, 10, ggml_type::f32, ggml_type::f32, true), "scalar", 2e-5},
        reference_case{"f16", model(rope_style::interleaved, 16, ggml_type::f16, ggml_type::f16, false), "", 2e-5},
        reference_case{"q8_0", model(rope_style::interleaved, 16, ggml_type::q8_0, ggml_type::q8_0, true), "", 3e-2},
        reference_case{"q4_1", model(rope_style::interleaved, 16, ggml_type::q4_1, ggml_type::q8_0, true), "", 3e-2},
        reference_case{"q4_0_scalar", model(rope_style::half, 16, ggml_type::q4_0, ggml_type::q8_0, false), "scalar",
                       3e-2},
        reference_case{"q4_0", model(rope_style::half, 16, ggml_type::q4_0, ggml_type::q8_0, false), "", 3e-2},
        reference_case{"q5_0", model(rope_style::half, 16, ggml_type::q5_0, ggml_type::q5_0, false), "", 3e-2},
        reference_case{"q5_1", model(rope_style::interleaved, 16, ggml_type::q5_1, ggml_type::q8_0, true), "", 3e-2},
        reference_case{"q5_1_scalar", model(rope_style::interleaved, 16, ggml_type::q5_1, ggml_type::q8_0, true),
                       "scalar", 3e-2},
        // bf16-rounded activations (the BF16 weights' format): errors of ~2^-9 per activation.
        reference_case{"bf16", model(rope_style::interleaved, 16, ggml_type::bf16, ggml_type::bf16, false), "", 1e-2},
        reference_case{"bf16_scalar", model(rope_style::half, 16, ggml_type::bf16, ggml_type::f32, true), "scalar",
                       1e-2},
        reference_case{"f16_wide", wide_model(ggml_type::f16), "", 2e-5},
        reference_case{"q2_k", wide_model(ggml_type::q2_k), "", 3e-2},
        reference_case{"q3_k", wide_model(ggml_type::q3_k, rope_style::half), "", 3e-2},
        reference_case{"q4_k", wide_model(ggml_type::q4_k), "", 3e-2},
        reference_case{"q4_k_scalar", wide_model(ggml_type::q4_k), "scalar", 3e-2},
        reference_case{"q5_k", wide_model(ggml_type::q5_k, rope_style::half), "", 3e-2},
        reference_case{"q6_k", wide_model(ggml_type::q6_k), "", 3e-2},
        reference_case{"mixed_types", mixed_model(), "", 3e-2},
        reference_case{"mixed_types_scalar", mixed_model(), "scalar", 3e-2},
        // Exact f32 weights with a reduced-precision KV cache: the error is the cache's rounding alone
        // (fp16 2^-11, bf16 2^-8 relative per element; int8 half a step of max|x|/127 per token and head).
        reference_case{"f32_kv_fp16", model(rope_style::interleaved, 16, ggml_type::f32, ggml_type::f32, false), "",
                       2e-3, cpu_kv_dtype::fp16},
        reference_case{"f32_kv_fp16_scalar", model(rope_style::half, 16, ggml_type::f32, ggml_type::f32, true),
                       "scalar", 2e-3, cpu_kv_dtype::fp16},
        reference_case{"f32_kv_bf16", model(rope_style::interleaved, 16, ggml_type::f32, ggml_type::f32, false), "",
                       1e-2, cpu_kv_dtype::bf16},
        reference_case{"f32_kv_int8", model(rope_style::half, 16, ggml_type::f32, ggml_type::f32, false), "", 2e-2,
                       cpu_kv_dtype::int8},
        reference_case{"f32_kv_int8_scalar", model(rope_style::interleaved, 16, ggml_type::f32, ggml_type::f32, true),
                       "scalar", 2e-2, cpu_kv_dtype::int8},
        reference_case{"q4_k_kv_int8", wide_model(ggml_type::q4_k), "", 3e-2, cpu_kv_dtype::int8}),
    [](const ::testing::TestParamInfo<reference_case>& p) { return std::string(p.param.name); });

// A decode step of one sequence has fewer attention tasks than twice the threads (2 kv heads, 2
// threads), so the executor splits each task's keys into segments of 128, a task each, and folds them
// after; a prefill's many tasks each walk all the segments themselves. Rows must not depend on which:
// the decoded rows equal the prefilled ones bit for bit, past the first segment, and both stay with
// the naive forward.
TEST(cpu_executor, key_segments_split_over_threads_give_the_unsplit_rows) {
  const auto w = make_tiny_model(model(rope_style::interleaved, 16, ggml_type::f32, ggml_type::f32, false));
  const std::vector<token_id> tokens = random_tokens(250, 12);
  auto ex = make_cpu_executor(w, opts(2, 4, 64, 0, "", cpu_kv_dtype::fp32));  // the naive forward's K and V
  const std::vector<std::vector<float>> prefilled = run_chunked(*ex, tokens, iota_table(0, 63), {250});
  const std::vector<std::vector<float>> decoded = run_chunked(*ex, tokens, iota_table(0, 63), {1});
  EXPECT_EQ(max_abs_diff(decoded, prefilled), 0.0);
  const auto ref = reference_forward(*w, tokens);
  double scale = 0.0;
  for (const auto& row : ref) {
    for (const double v : row) scale = std::max(scale, std::fabs(v));
  }
  std::vector<std::vector<float>> ref_rows;
  for (const auto& row : ref) ref_rows.emplace_back(row.begin(), row.end());
  EXPECT_LE(max_abs_diff(decoded, ref_rows), 2e-5 * scale);
}

// ---- paging invariance -------------------------------------------------------------------------

class paging_test : public ::testing::TestWithParam<ggml_type> {
 protected:
  void SetUp() override {
    tiny_options o = model(rope_style::interleaved, 16, GetParam(), ggml_type::q8_0, true);
    o.wide = type_info(GetParam()).block_elems == 256;  // K-quants need rows of whole super-blocks
    weights_ = make_tiny_model(o);
    tokens_ = random_tokens(37, 5);
    ex_ = make_cpu_executor(weights_, opts(2));
    baseline_ = run_chunked(*ex_, tokens_, iota_table(0, 10), {37});
  }
  std::shared_ptr<const model_weights> weights_;
  std::vector<token_id> tokens_;
  std::unique_ptr<executor> ex_;
  std::vector<std::vector<float>> baseline_;
};

// Same kernels on the same data in the same order: the results are bitwise equal; the test allows
// 1e-5 so that a future kernel with batch-dependent order still passes if it stays this close.
constexpr double paging_tolerance = 1e-5;

TEST_P(paging_test, chunked_prefill_matches_one_shot) {
  for (int chunk : {1, 3, 7, 16}) {
    EXPECT_LE(max_abs_diff(run_chunked(*ex_, tokens_, iota_table(20, 10), {chunk}), baseline_), paging_tolerance)
        << "chunk " << chunk;
  }
  EXPECT_LE(max_abs_diff(run_chunked(*ex_, tokens_, iota_table(30, 10), {5, 1, 9, 2}), baseline_), paging_tolerance);
}

TEST_P(paging_test, shuffled_block_tables_match) {
  std::vector<block_id> table = iota_table(0, 64);
  std::mt19937 rng(3);
  std::shuffle(table.begin(), table.end(), rng);
  table.resize(10);
  EXPECT_LE(max_abs_diff(run_chunked(*ex_, tokens_, table, {37}), baseline_), paging_tolerance);
  EXPECT_LE(max_abs_diff(run_chunked(*ex_, tokens_, table, {6}), baseline_), paging_tolerance);
}

TEST_P(paging_test, batching_with_other_sequences_matches) {
  // Two other sequences: a long prefill and a decode, with their own blocks, sharing every step.
  const std::vector<token_id> other = random_tokens(30, 9);
  auto other_ex = make_cpu_executor(weights_, opts(1));
  const auto other_alone = run_chunked(*other_ex, other, iota_table(0, 8), {30});
  std::vector<std::vector<float>> mine, others;
  const std::vector<block_id> my_table = {40, 41, 12, 13, 50, 51, 52, 2, 3, 60};
  const std::vector<block_id> other_table = {20, 21, 22, 23, 24, 25, 26, 27};
  size_t done = 0, other_done = 0;
  for (int step = 0; done < tokens_.size(); ++step) {
    const size_t n = std::min<size_t>(tokens_.size() - done, step % 2 == 0 ? 5 : 1);
    step_batch b;
    if (other_done < other.size()) {
      const size_t m = std::min<size_t>(other.size() - other_done, step == 0 ? 20 : 1);
      b.seqs.push_back(
          slice(2, {other.begin() + static_cast<long>(other_done), other.begin() + static_cast<long>(other_done + m)},
                static_cast<int32_t>(other_done), other_table, sequence_slice::logits_mode::all));
      other_done += m;
    }
    b.seqs.push_back(slice(3, {tokens_[0]}, 0, {63}, sequence_slice::logits_mode::none));  // a throwaway seq
    b.seqs.push_back(slice(1,
                           {tokens_.begin() + static_cast<long>(done), tokens_.begin() + static_cast<long>(done + n)},
                           static_cast<int32_t>(done), my_table));
    step_output out;
    ex_->execute(b, out);
    const size_t me = b.seqs.size() - 1;
    EXPECT_EQ(out.num_rows[me - 1], 0);
    for (int32_t r = 0; r < out.num_rows[me]; ++r)
      mine.emplace_back(out.row(out.first_row[me] + r).begin(), out.row(out.first_row[me] + r).end());
    if (me == 2) {
      for (int32_t r = 0; r < out.num_rows[0]; ++r)
        others.emplace_back(out.row(out.first_row[0] + r).begin(), out.row(out.first_row[0] + r).end());
    }
    done += n;
  }
  EXPECT_LE(max_abs_diff(mine, baseline_), paging_tolerance);
  others.resize(std::min(others.size(), other_alone.size()));
  EXPECT_LE(max_abs_diff(others, {other_alone.begin(), other_alone.begin() + static_cast<long>(others.size())}),
            paging_tolerance);
}

TEST_P(paging_test, copies_and_swap_round_trips_preserve_the_cache) {
  // Prefill 20 tokens in blocks 0..4, then continue in three ways that must agree with baseline.
  const std::vector<token_id> head(tokens_.begin(), tokens_.begin() + 20);
  const std::vector<token_id> tail(tokens_.begin() + 20, tokens_.end());
  auto continue_with = [&](const std::vector<block_id>& table, step_batch first) {
    first.seqs.push_back(slice(1, tail, 20, table));
    step_output out;
    ex_->execute(first, out);
    std::vector<std::vector<float>> rows;
    for (int32_t r = 0; r < out.num_rows[0]; ++r)
      rows.emplace_back(out.row(out.first_row[0] + r).begin(), out.row(out.first_row[0] + r).end());
    return rows;
  };
  const std::vector<std::vector<float>> want(baseline_.begin() + 20, baseline_.end());

  run_chunked(*ex_, head, iota_table(0, 10), {20});
  {  // (1) copy-on-write: blocks 0..4 copied to 30..34, then continue there.
    step_batch b;
    for (int32_t i = 0; i < 5; ++i) b.copies.push_back({i, 30 + i});
    EXPECT_LE(max_abs_diff(continue_with({30, 31, 32, 33, 34, 35, 36, 37, 38, 39}, b), want), paging_tolerance);
  }
  run_chunked(*ex_, head, iota_table(0, 10), {20});
  {  // (2) swap out to host, clobber the device blocks with another sequence, swap back elsewhere.
    step_batch out_batch;
    for (int32_t i = 0; i < 5; ++i) out_batch.swap_out.push_back({i, 10 + i});
    step_output ignored;
    ex_->execute(out_batch, ignored);
    run_chunked(*ex_, random_tokens(20, 77), iota_table(0, 5), {20});
    step_batch in_batch;
    for (int32_t i = 0; i < 5; ++i) in_batch.swap_in.push_back({10 + i, 44 + i});
    EXPECT_LE(max_abs_diff(continue_with({44, 45, 46, 47, 48, 5, 6, 7, 8, 9}, in_batch), want), paging_tolerance);
  }
  {  // (3) without the swap-in, the clobbered blocks give different logits (the test can fail).
    run_chunked(*ex_, head, iota_table(0, 10), {20});
    run_chunked(*ex_, random_tokens(20, 78), iota_table(0, 5), {20});
    EXPECT_GT(max_abs_diff(continue_with(iota_table(0, 10), {}), want), 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(types, paging_test,
                         ::testing::Values(ggml_type::f32, ggml_type::q4_1, ggml_type::q5_0, ggml_type::f16,
                                           ggml_type::bf16, ggml_type::q4_k, ggml_type::q6_k),
                         [](const ::testing::TestParamInfo<ggml_type>& p) {
                           return std::string(type_info(p.param).name);
                         });

// ---- interface details ---------------------------------------------------------------------------

TEST(cpu_executor, logits_modes_and_sizes) {
  const auto w = make_tiny_model({});
  auto ex = make_cpu_executor(w, opts(1, 8, 4, 2));
  EXPECT_STREQ(ex->name(), "cpu");
  EXPECT_EQ(ex->kv_spec().block_size, 8);
  EXPECT_EQ(ex->kv_block_bytes(), cpu_kv_block_bytes(w->config, 8));
  EXPECT_STREQ(ex->kv_cache_dtype(), "fp16");  // the default
  // layers x K|V x kv heads x (8 slots x head dim 16 elements [+ 8 int8 scales]).
  EXPECT_EQ(ex->kv_block_bytes(), 2 * 2 * 2 * 8 * 16 * 2);
  EXPECT_EQ(cpu_kv_block_bytes(w->config, 8, cpu_kv_dtype::fp32), 2 * 2 * 2 * 8 * 16 * 4);
  EXPECT_EQ(cpu_kv_block_bytes(w->config, 8, cpu_kv_dtype::bf16), 2 * 2 * 2 * 8 * 16 * 2);
  EXPECT_EQ(cpu_kv_block_bytes(w->config, 8, cpu_kv_dtype::int8), 2 * 2 * 2 * (8 * 16 + 8 * 4));
  for (const cpu_kv_dtype d : {cpu_kv_dtype::fp32, cpu_kv_dtype::bf16, cpu_kv_dtype::int8}) {
    auto e = make_cpu_executor(w, opts(1, 8, 4, 2, "", d));
    EXPECT_STREQ(e->kv_cache_dtype(), to_string(d));
    EXPECT_EQ(e->kv_block_bytes(), cpu_kv_block_bytes(w->config, 8, d));
  }
  EXPECT_EQ(parse_cpu_kv_dtype("int8"), cpu_kv_dtype::int8);
  EXPECT_EQ(parse_cpu_kv_dtype("auto"), cpu_kv_dtype::automatic);
  EXPECT_EQ(parse_cpu_kv_dtype("q8_0"), std::nullopt);
  EXPECT_EQ(resolve(cpu_kv_dtype::automatic, /*dequantize_weights=*/true), cpu_kv_dtype::fp32);
  EXPECT_EQ(kv_blocks_for_bytes(w->config, 8, ex->kv_block_bytes() * 5 + 7), 5);
  EXPECT_EQ(kv_blocks_for_bytes(w->config, 8, -1), 0);
  step_batch b;
  b.seqs.push_back(slice(1, {1, 2, 3}, 0, {0}, sequence_slice::logits_mode::none));
  b.seqs.push_back(slice(2, {4, 5}, 0, {1}, sequence_slice::logits_mode::all));
  b.seqs.push_back(slice(3, {6, 7, 8}, 0, {2}, sequence_slice::logits_mode::last));
  step_output out;
  ex->execute(b, out);
  EXPECT_EQ(out.num_rows, (std::vector<int32_t>{0, 2, 1}));
  EXPECT_EQ(out.first_row[1], 0);
  EXPECT_EQ(out.first_row[2], 2);
  EXPECT_EQ(out.logits.size(), 3u * 100u);
  for (float v : out.logits) EXPECT_TRUE(std::isfinite(v));
}

TEST(cpu_executor, rejects_bad_steps_without_touching_state) {
  const auto w = make_tiny_model({});
  auto ex = make_cpu_executor(w, opts(1, 4, 4, 1));
  step_output out;
  auto expect_invalid = [&](step_batch b) { EXPECT_THROW(ex->execute(b, out), invalid_request); };
  {
    step_batch b;
    b.seqs.push_back(slice(1, {1, 2, 3, 4, 5}, 0, {0}));  // table too short
    expect_invalid(b);
  }
  {
    step_batch b;
    b.seqs.push_back(slice(1, {1}, 0, {4}));  // block out of range
    expect_invalid(b);
  }
  {
    step_batch b;
    b.seqs.push_back(slice(1, {100}, 0, {0}));  // token out of vocab
    expect_invalid(b);
  }
  {
    step_batch b;
    b.swap_in.push_back({1, 0});  // host block out of range
    expect_invalid(b);
  }
  EXPECT_THROW(make_cpu_executor(w, opts(1, 0)), invalid_request);
  EXPECT_THROW(make_cpu_executor(w, opts(1, 4, 4, 0, "no-such-kernels")), invalid_request);
  auto broken = std::make_shared<model_weights>(*w);
  broken->layers[1].wk.rows = 16;
  EXPECT_THROW(make_cpu_executor(broken, opts(1)), load_error);
}

TEST(cpu_executor, a_rejected_step_leaves_the_cache_untouched) {
  const auto w = make_tiny_model({});
  const std::vector<token_id> tokens = random_tokens(7, 21);
  auto ex = make_cpu_executor(w, opts(1, 4, 8, 2));
  const auto want = run_chunked(*ex, tokens, {0, 1}, {7});
  run_chunked(*ex, {tokens.begin(), tokens.end() - 1}, {0, 1}, {6});  // cache holds tokens[0..6)
  run_chunked(*ex, random_tokens(8, 22), {2, 3}, {8});                // another sequence
  step_batch bad;
  bad.copies.push_back({2, 0});   // valid, would clobber block 0 ...
  bad.copies.push_back({99, 1});  // ... but the step is rejected
  step_output out;
  EXPECT_THROW(ex->execute(bad, out), invalid_request);
  step_batch last;
  last.seqs.push_back(slice(1, {tokens.back()}, 6, {0, 1}, sequence_slice::logits_mode::last));
  ex->execute(last, out);
  const std::vector<std::vector<float>> got = {{out.row(0).begin(), out.row(0).end()}};
  EXPECT_LE(max_abs_diff(got, {want.back()}), paging_tolerance);
}

}  // namespace
}  // namespace tessera
