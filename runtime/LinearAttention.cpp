//===- LinearAttention.cpp - linear attention's stateless kernels ---------===//

#include "runtime/LinearAttention.h"
#include "runtime/Ops.h"
#include "runtime/Recompute.h"
#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/DeltaRuleKernel.h"
#endif

#include <cmath>

namespace adapt::rt {

torch::Tensor causalConv1dSilu(const torch::Tensor &x, const torch::Tensor &weight,
                               const torch::Tensor &previous) {
  if (previous.defined()) { // The previous inputs instead of zero padding.
    const int64_t before = previous.size(1);
    return causalConv1dSilu(torch::cat({previous.to(x.scalar_type()), x}, 1), weight).narrow(1, before, x.size(1));
  }
  TORCH_CHECK(x.dim() == 3, "causalConv1dSilu: expected x [B, T, C], got ", x.sizes());
  torch::Tensor w = weight.dim() == 2 ? weight.unsqueeze(1) : weight;
  TORCH_CHECK(w.dim() == 3 && w.size(1) == 1 && w.size(0) == x.size(2),
              "causalConv1dSilu: expected weight [C, 1, K] with C = ", x.size(2), ", got ", weight.sizes());
  const int64_t seqLen = x.size(1), kernel = w.size(2);
  // [B, C, T], left-padded by K - 1 (conv1d pads both sides; keep the first T).
  torch::Tensor out = torch::conv1d(x.transpose(1, 2).to(w.scalar_type()), w, /*bias=*/{}, /*stride=*/1,
                                    /*padding=*/kernel - 1, /*dilation=*/1, /*groups=*/x.size(2));
  out = torch::silu(out.narrow(2, 0, seqLen));
  return out.transpose(1, 2).to(x.scalar_type());
}

torch::Tensor l2Normalize(const torch::Tensor &x, double eps) {
  return x * torch::rsqrt((x * x).sum(-1, /*keepdim=*/true) + eps);
}

torch::Tensor gatedRmsNorm(const torch::Tensor &x, const torch::Tensor &weight,
                           const torch::Tensor &gate, double eps) {
  const auto dtype = x.scalar_type();
  torch::Tensor h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  h = weight * h.to(dtype);
  h = h * torch::silu(gate.to(torch::kFloat32));
  return h.to(dtype);
}

torch::Tensor sigmoidGatedRmsNorm(const torch::Tensor &x, const torch::Tensor &weight,
                                  const torch::Tensor &gate, double eps) {
  torch::Tensor h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  h = weight.to(torch::kFloat32) * h * torch::sigmoid(gate.to(torch::kFloat32));
  return h.to(x.scalar_type());
}

torch::Tensor zeroCentredRmsNorm(const torch::Tensor &x, const torch::Tensor &weight, double eps) {
  if (torch::Tensor y = rmsNormByKernel(x, weight, eps, 1.0); y.defined())
    return y;
  torch::Tensor h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (h * (1.0 + weight.to(torch::kFloat32))).to(x.scalar_type());
}

namespace {

/// The inputs in fp32 with the query scaled and the decay as [B, H, T, G]
/// (G = 1 for a per-head decay, dk per channel).
struct Fp32Inputs {
  torch::Tensor q, k, v, g, beta;
};

Fp32Inputs prepare(const DeltaRuleInputs &in, const char *op) {
  const auto &k = in.key;
  TORCH_CHECK(k.dim() == 4, op, ": expected key [B, H, T, dk], got ", k.sizes());
  const int64_t b = k.size(0), h = k.size(1), t = k.size(2), dk = k.size(3);
  TORCH_CHECK(in.query.sizes() == k.sizes(), op, ": expected query ", k.sizes(), ", got ", in.query.sizes());
  TORCH_CHECK(in.value.dim() == 4 && in.value.size(0) == b && in.value.size(1) == h && in.value.size(2) == t,
              op, ": expected value [", b, ", ", h, ", ", t, ", dv], got ", in.value.sizes());
  TORCH_CHECK(in.beta.sizes() == torch::IntArrayRef({b, h, t}), op, ": expected beta [", b, ", ", h, ", ", t,
              "], got ", in.beta.sizes());
  const bool perChannel = in.decay.dim() == 4;
  TORCH_CHECK((!perChannel && in.decay.sizes() == in.beta.sizes()) ||
                  (perChannel && in.decay.sizes() == k.sizes()),
              op, ": expected decay [B, H, T] or [B, H, T, dk], got ", in.decay.sizes());
  Fp32Inputs f;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  f.q = in.query.to(torch::kFloat32) * scale;
  f.k = in.key.to(torch::kFloat32);
  f.v = in.value.to(torch::kFloat32);
  f.beta = in.beta.to(torch::kFloat32);
  f.g = perChannel ? in.decay.to(torch::kFloat32) : in.decay.to(torch::kFloat32).unsqueeze(-1);
  return f;
}

} // namespace

torch::Tensor gatedDeltaRuleRecurrent(const DeltaRuleInputs &in, torch::Tensor *finalState) {
  Fp32Inputs f = prepare(in, "gatedDeltaRuleRecurrent");
  const int64_t b = f.k.size(0), h = f.k.size(1), t = f.k.size(2), dk = f.k.size(3), dv = f.v.size(3);
  torch::Tensor state = torch::zeros({b, h, dk, dv}, f.v.options());
  std::vector<torch::Tensor> outs;
  outs.reserve(t);
  for (int64_t i = 0; i < t; ++i) {
    torch::Tensor qi = f.q.select(2, i), ki = f.k.select(2, i), vi = f.v.select(2, i);
    // Decay the state rows (key channels), then write the corrected value.
    state = state * f.g.select(2, i).exp().unsqueeze(-1);
    torch::Tensor predicted = (state * ki.unsqueeze(-1)).sum(-2);
    torch::Tensor delta = (vi - predicted) * f.beta.select(2, i).unsqueeze(-1);
    state = state + ki.unsqueeze(-1) * delta.unsqueeze(-2);
    outs.push_back((state * qi.unsqueeze(-1)).sum(-2));
  }
  if (finalState)
    *finalState = state;
  return torch::stack(outs, 2).to(in.query.scalar_type());
}

namespace {

/// The chunked form's serial part, chunk after chunk from the state S_0:
///   U_n = V_n - R_n S_n,  O_n = Q_n S_n + A_n U_n,  S_{n+1} = diag(d_n) S_n + W_n^T U_n
/// over values V [b, h, n, c, dv], state readers R, decayed queries Q and
/// state writers W [b, h, n, c, dk], intra-chunk scores A [b, h, n, c, c] and
/// chunk decays d [b, h, n, G] (G 1: one per head; dk: per key channel), all
/// fp32. Returns O [b, h, n, c, dv], the states S_n entering each chunk
/// [b, h, n, dk, dv] (what backward needs) and S_N [b, h, dk, dv]. A CUDA
/// kernel where it fits (one block per head and 32 value columns runs every
/// chunk: no launch per chunk), else LibTorch ops per chunk.
std::vector<torch::Tensor> chunkRecurrenceForward(const std::vector<torch::Tensor> &x, const torch::Tensor &state0) {
  const torch::Tensor &values = x[0], &reads = x[1], &queries = x[2], &scores = x[3], &decays = x[4],
                      &writes = x[5];
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (cuda::deltaRecurrenceFits(values, reads))
    return cuda::deltaRecurrenceForward(values, reads, queries, scores, decays, writes, state0);
#endif
  const int64_t chunks = values.size(2);
  torch::Tensor state = state0;
  std::vector<torch::Tensor> outs, states;
  for (int64_t n = 0; n < chunks; ++n) {
    states.push_back(state);
    torch::Tensor corrected = values.select(2, n) - torch::matmul(reads.select(2, n), state);
    outs.push_back(torch::matmul(queries.select(2, n), state) + torch::matmul(scores.select(2, n), corrected));
    state = state * decays.select(2, n).unsqueeze(-1) + torch::matmul(writes.select(2, n).transpose(-1, -2), corrected);
  }
  return {torch::stack(outs, 2), torch::stack(states, 2), state};
}

/// The gradients of chunkRecurrenceForward's inputs (V, R, Q, A, d, W, S_0)
/// from those of O and S_N, chunk after chunk backwards, with U_n recomputed
/// from the saved S_n:
///   dU = A^T dO + W dS',  dA = dO U^T,  dQ = dO S^T,  dW = U dS'^T,
///   dR = -dU S^T,  dd = rowsum(S * dS'),  dS = Q^T dO + diag(d) dS' - R^T dU.
std::vector<torch::Tensor> chunkRecurrenceBackward(const std::vector<torch::Tensor> &x, const torch::Tensor &states,
                                                   const torch::Tensor &gradOut, const torch::Tensor &gradFinal) {
  const torch::Tensor &values = x[0], &reads = x[1], &queries = x[2], &scores = x[3], &decays = x[4],
                      &writes = x[5];
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (cuda::deltaRecurrenceFits(values, reads))
    return cuda::deltaRecurrenceBackward(values, reads, queries, scores, decays, writes, states, gradOut, gradFinal);
#endif
  const int64_t chunks = values.size(2);
  const bool perChannel = decays.size(-1) > 1;
  torch::Tensor g = gradFinal;
  std::vector<torch::Tensor> dV(chunks), dR(chunks), dQ(chunks), dA(chunks), dd(chunks), dW(chunks);
  for (int64_t n = chunks - 1; n >= 0; --n) {
    const torch::Tensor S = states.select(2, n), St = S.transpose(-1, -2), gO = gradOut.select(2, n);
    const torch::Tensor R = reads.select(2, n), W = writes.select(2, n);
    const torch::Tensor U = values.select(2, n) - torch::matmul(R, S);
    const torch::Tensor gU = torch::matmul(scores.select(2, n).transpose(-1, -2), gO) + torch::matmul(W, g);
    dV[n] = gU;
    dA[n] = torch::matmul(gO, U.transpose(-1, -2));
    dQ[n] = torch::matmul(gO, St);
    dW[n] = torch::matmul(U, g.transpose(-1, -2));
    dR[n] = -torch::matmul(gU, St);
    const torch::Tensor rows = (S * g).sum(-1); // [b, h, dk]
    dd[n] = perChannel ? rows : rows.sum(-1, /*keepdim=*/true);
    g = torch::matmul(queries.select(2, n).transpose(-1, -2), gO) + g * decays.select(2, n).unsqueeze(-1) -
        torch::matmul(R.transpose(-1, -2), gU);
  }
  return {torch::stack(dV, 2), torch::stack(dR, 2), torch::stack(dQ, 2), torch::stack(dA, 2),
          torch::stack(dd, 2),  torch::stack(dW, 2), g};
}

/// chunkRecurrenceForward with its backward: autograd keeps the entering
/// state of each chunk instead of every per-chunk product.
struct ChunkRecurrence : torch::autograd::Function<ChunkRecurrence> {
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &values,
                                              const torch::Tensor &reads, const torch::Tensor &queries,
                                              const torch::Tensor &scores, const torch::Tensor &decays,
                                              const torch::Tensor &writes, const torch::Tensor &state0) {
    std::vector<torch::Tensor> r =
        chunkRecurrenceForward({values, reads, queries, scores, decays, writes}, state0);
    ctx->save_for_backward({values, reads, queries, scores, decays, writes, r[1]});
    return {r[0], r[2]};
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor gradOut = grads[0].defined() ? grads[0].contiguous() : torch::zeros_like(saved[0]);
    const torch::Tensor gradFinal = grads[1].defined() ? grads[1].contiguous() : torch::zeros_like(saved[6].select(2, 0));
    return chunkRecurrenceBackward({saved.begin(), saved.begin() + 6}, saved[6], gradOut, gradFinal);
  }
};

/// The chunked form from \p initialState (undefined: zeros); returns fp32.
torch::Tensor chunkedForm(const Fp32Inputs &f, int64_t chunkSize, const torch::Tensor &initialState,
                          torch::Tensor *finalState) {
  const int64_t b = f.k.size(0), h = f.k.size(1), t = f.k.size(2), dk = f.k.size(3), dv = f.v.size(3);
  const int64_t c = chunkSize, pad = (c - t % c) % c, chunks = (t + pad) / c;
  const bool perChannel = f.g.size(-1) > 1;
  // Padding tokens have k = 0, beta = 0 and decay 0: they change nothing.
  auto chunked = [&](const torch::Tensor &x) {
    return torch::constant_pad_nd(x, {0, 0, 0, pad}).view({b, h, chunks, c, x.size(-1)});
  };
  torch::Tensor q = chunked(f.q), k = chunked(f.k), v = chunked(f.v), g = chunked(f.g);
  torch::Tensor beta = chunked(f.beta.unsqueeze(-1));
  torch::Tensor kBeta = k * beta, vBeta = v * beta;

  // Log decay from the chunk start through each position, and the decay
  // between positions i <= t of a chunk (zero above the diagonal).
  torch::Tensor cum = g.cumsum(3);                                          // [b, h, n, c, G]
  torch::Tensor upper = torch::ones({c, c}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  torch::Tensor pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3))            // [b, h, n, t, i, G]
                               .masked_fill(upper.unsqueeze(-1), -INFINITY)
                               .exp();
  // sum_c x_tc y_ic exp(cum_tc - cum_ic) for every pair (t, i).
  auto decayedScores = [&](const torch::Tensor &x, const torch::Tensor &y) {
    if (!perChannel)
      return torch::matmul(x, y.transpose(-1, -2)) * pairwise.squeeze(-1);
    return (x.unsqueeze(4) * y.unsqueeze(3) * pairwise).sum(-1);
  };
  // The UT transform: (I + strictly-lower(beta_t k_t.k_i decay)) W = X for
  // the values and the decayed keys that read the chunk's incoming state.
  torch::Tensor system = decayedScores(kBeta, k);
  torch::Tensor newValues = torch::linalg_solve_triangular(system, vBeta, /*upper=*/false, /*left=*/true,
                                                           /*unitriangular=*/true);
  torch::Tensor keysReadingState = torch::linalg_solve_triangular(system, kBeta * cum.exp(), /*upper=*/false,
                                                                  /*left=*/true, /*unitriangular=*/true);
  torch::Tensor intra = decayedScores(q, k);                                 // [b, h, n, t, i], i <= t
  torch::Tensor queryDecayed = q * cum.exp();                                // reads the incoming state
  torch::Tensor last = cum.narrow(3, c - 1, 1);                              // [b, h, n, 1, G]
  torch::Tensor keyToEnd = k * (last - cum).exp();                           // writes the outgoing state
  torch::Tensor chunkDecay = last.exp().transpose(-1, -2);                   // [b, h, n, G, 1]

  torch::Tensor state = initialState.defined() ? initialState : torch::zeros({b, h, dk, dv}, f.v.options());
  torch::autograd::tensor_list r =
      ChunkRecurrence::apply(newValues.contiguous(), keysReadingState.contiguous(), queryDecayed.contiguous(),
                             intra.contiguous(), chunkDecay.squeeze(-1).contiguous(), keyToEnd.contiguous(),
                             state.contiguous());
  if (finalState)
    *finalState = r[1];
  return r[0].view({b, h, chunks * c, dv}).narrow(2, 0, t);
}

} // namespace

torch::Tensor gatedDeltaRuleChunked(const DeltaRuleInputs &in, int64_t chunkSize, torch::Tensor *finalState) {
  TORCH_CHECK(chunkSize > 0, "gatedDeltaRuleChunked: expected a positive chunk size, got ", chunkSize);
  return chunkedForm(prepare(in, "gatedDeltaRuleChunked"), chunkSize, torch::Tensor(), finalState)
      .to(in.query.scalar_type());
}

torch::Tensor gatedDeltaRuleSegmented(const DeltaRuleInputs &in, int64_t chunkSize, int64_t segmentTokens) {
  return gatedDeltaRuleSegmented(in, chunkSize, segmentTokens, torch::Tensor(), nullptr);
}

torch::Tensor gatedDeltaRuleSegmented(const DeltaRuleInputs &in, int64_t chunkSize, int64_t segmentTokens,
                                      const torch::Tensor &initialState, torch::Tensor *finalState) {
  TORCH_CHECK(chunkSize > 0, "gatedDeltaRuleSegmented: expected a positive chunk size, got ", chunkSize);
  const int64_t t = in.key.dim() == 4 ? in.key.size(2) : 0;
  if (segmentTokens <= 0 || segmentTokens >= t || !torch::GradMode::is_enabled())
    return chunkedForm(prepare(in, "gatedDeltaRuleSegmented"), chunkSize, initialState, finalState)
        .to(in.query.scalar_type());
  prepare(in, "gatedDeltaRuleSegmented"); // shape checks, with this op's name
  // Segments of whole chunks, so the chunk boundaries match the plain form's.
  const int64_t segment = std::max<int64_t>(1, segmentTokens / chunkSize) * chunkSize;
  // split, not narrow: one backward node stacks every segment's gradient.
  const std::vector<torch::Tensor> q = in.query.split(segment, 2), k = in.key.split(segment, 2),
                                   v = in.value.split(segment, 2), g = in.decay.split(segment, 2),
                                   beta = in.beta.split(segment, 2);
  const int64_t b = in.key.size(0), h = in.key.size(1), dk = in.key.size(3), dv = in.value.size(3);
  torch::Tensor state = initialState.defined() ? initialState
                                              : torch::zeros({b, h, dk, dv}, in.value.options().dtype(torch::kFloat32));
  RecomputedFunctions segmentFn = [chunkSize](const std::vector<torch::Tensor> &x) {
    DeltaRuleInputs part{x[0], x[1], x[2], x[3], x[4]};
    torch::Tensor leaving;
    torch::Tensor out = chunkedForm(prepare(part, "gatedDeltaRuleSegmented"), chunkSize, x[5], &leaving);
    return std::vector<torch::Tensor>{out.to(x[0].scalar_type()), leaving};
  };
  std::vector<torch::Tensor> outs;
  for (size_t s = 0; s < q.size(); ++s) {
    std::vector<torch::Tensor> r = recompute(segmentFn, {q[s], k[s], v[s], g[s], beta[s], state});
    outs.push_back(r[0]);
    state = r[1];
  }
  if (finalState)
    *finalState = state;
  return torch::cat(outs, 2);
}

} // namespace adapt::rt
