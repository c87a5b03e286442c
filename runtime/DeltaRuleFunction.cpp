//===- DeltaRuleFunction.cpp - the delta rule with an explicit backward ---===//
//
// Shapes inside: [b, h, n, c, d] for n chunks of c tokens, fp32; a chunk's
// cumulative log decay G is [b, h, n, c, 1]. Padding tokens (k = 0, b = 0,
// decay 0) change nothing, and their gradients are dropped.
//
//===----------------------------------------------------------------------===//

#include "runtime/DeltaRuleFunction.h"
#include "runtime/ChunkedTensors.h"
#include "runtime/KernelLedger.h"
#include "runtime/Tf32Scope.h"

#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/DeltaRuleKernel.h"
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>

namespace adapt::rt {

namespace {

using torch::Tensor;

/// What forward and backward both derive from the inputs.
struct ChunkTerms {
  Tensor decayPairs;   ///< D = e^{G_t - G_i} for i <= t, 0 above [b, h, n, c, c].
  Tensor gamma;        ///< e^G [b, h, n, c, 1].
  Tensor last;         ///< G of the chunk's last token [b, h, n, 1, 1].
  Tensor toEnd;        ///< e^{G_last - G} [b, h, n, c, 1].
  Tensor keysWeighted; ///< Xk = diag(b e^G) K.
  Tensor keysToEnd;    ///< Kd = diag(e^{G_last - G}) K.
};

ChunkTerms chunkTerms(const Tensor &k, const Tensor &beta, const Tensor &cum, const Masks &m) {
  ChunkTerms t;
  Tensor diff = cum - transposed(cum); // [.., c, c]: G_t - G_i
  t.decayPairs = diff.masked_fill(m.inclusive.eq(0), -INFINITY).exp();
  t.gamma = cum.exp();
  t.last = cum.narrow(3, cum.size(3) - 1, 1);
  t.toEnd = (t.last - cum).exp();
  t.keysWeighted = k * (beta * t.gamma);
  t.keysToEnd = k * t.toEnd;
  return t;
}

/// e^{G_last} I - Kd^T W, the chunk's state transition [b, h, n, dk, dk].
Tensor transition(const ChunkTerms &t, const Tensor &w) {
  const int64_t dk = w.size(-1);
  Tensor eye = torch::eye(dk, w.options());
  return t.last.exp() * eye - torch::matmul(transposed(t.keysToEnd), w);
}

#ifdef ADAPT_WITH_CUDA_KERNELS
/// How far the kernels are taken: never, where the GPU op checks cover them,
/// or always.
enum class KernelUse { Never, Checked, Always };

/// The environment variable \p name: "0" Never, "1" Always, otherwise Checked.
KernelUse kernelUse(const char *name) {
  const char *v = std::getenv(name);
  if (v != nullptr && std::strcmp(v, "0") == 0)
    return KernelUse::Never;
  if (v != nullptr && std::strcmp(v, "1") == 0)
    return KernelUse::Always;
  return KernelUse::Checked;
}

/// Whether the forward without a graph takes the forward kernels (checked on
/// an H100 by `gated_delta_rule.no_grad`): yes unless ADAPT_DELTA_RULE_KERNEL=0,
/// which keeps the LibTorch forward (to compare the two, or to rule the
/// kernels out).
bool forwardKernelEnabled() {
  static const bool enabled = kernelUse("ADAPT_DELTA_RULE_KERNEL") != KernelUse::Never;
  return enabled;
}

/// Training's forward kernels (runtime/cuda/DeltaRuleKernel.h), which also
/// hand over T, the states, V_new and W for the backward: by default for bf16
/// on the GPU when no gradient flows into the initial state (what the
/// `gated_delta_rule.chunked` op checks covered on an H100);
/// ADAPT_DELTA_RULE_TRAIN_KERNEL=1 takes them always, =0 never.
KernelUse trainingKernelUse() {
  static const KernelUse use = kernelUse("ADAPT_DELTA_RULE_TRAIN_KERNEL");
  return use;
}

/// The GPU's whole backward after the forward kernels
/// (cuda::gatedDeltaRuleBackward), rather than the LibTorch algebra below:
/// by default when no gradient flows through the initial or the final state
/// (the `gated_delta_rule.chunked` checks passed on an H100, bf16 3.4e-3
/// against 2.5e-2; the segmented ones, with state gradients, have not run on
/// a GPU yet); ADAPT_DELTA_RULE_BACKWARD_KERNEL=1 takes it always, =0 never.
KernelUse backwardKernelUse() {
  static const KernelUse use = kernelUse("ADAPT_DELTA_RULE_BACKWARD_KERNEL");
  return use;
}

/// What the LibTorch backward reads, {q scale, k, v, beta, G, T, states,
/// V_new} as fp32 chunks [b, h, n, 64, ..], from the forward kernels' inputs
/// and what they kept.
std::vector<Tensor> chunksFromKernels(const Tensor &query, const Tensor &key, const Tensor &value, const Tensor &beta,
                                      const cuda::DeltaRuleSaved &kept) {
  const int64_t b = key.size(0), h = key.size(1), dk = key.size(3), dv = value.size(3);
  const int64_t c = kept.inverse.size(-1), n = kept.states.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  return {toChunks(query, c) * scale,
          toChunks(key, c),
          toChunks(value, c),
          toChunks(beta.unsqueeze(-1), c),
          kept.cum.view({b, h, n, c, 1}),
          kept.inverse.view({b, h, n, c, c}).to(torch::kFloat32),
          kept.states.view({b, h, n, dk, dv}).to(torch::kFloat32),
          kept.newValues.view({b, h, n, c, dv}).to(torch::kFloat32)};
}
#endif

struct DeltaRuleNode : torch::autograd::Function<DeltaRuleNode> {
  /// Outputs {O [B, H, T, dv] in the query's dtype, S_T fp32}; \p state
  /// [B, H, dk, dv] (zeros when no initial state was given).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, const Tensor &query,
                                                const Tensor &key, const Tensor &value, const Tensor &decay,
                                                const Tensor &beta, const Tensor &state, int64_t chunk, bool tf32) {
    const Tf32Scope scope(tf32);
    const int64_t b = key.size(0), h = key.size(1), t = key.size(2), dk = key.size(3), dv = value.size(3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
    saveDeltaRuleShape(ctx, t, {query, key, value, decay, beta, state}, tf32, chunk);
#ifdef ADAPT_WITH_CUDA_KERNELS
    const KernelUse train = trainingKernelUse();
    if (t > 0 && chooseKernel("gated_delta_rule.train", key,
                              train == KernelUse::Always || (train == KernelUse::Checked && !state.requires_grad()),
                              cuda::deltaRuleForwardTakes(query, key, value, decay, beta, chunk))) {
      // The inputs themselves are kept (bf16), and the kernels' bf16 states,
      // V_new and W: the backward rebuilds the fp32 chunks it needs.
      cuda::DeltaRuleSaved saved;
      Tensor last;
      Tensor out = cuda::gatedDeltaRuleForward(query, key, value, decay, beta, state, &last, &saved);
      ctx->saved_data["kernels"] = true;
      ctx->saved_data["stateGrad"] = state.requires_grad();
      ctx->set_materialize_grads(false); // an unused final state's gradient stays undefined
      ctx->save_for_backward({query, key, value, beta, saved.cum, saved.inverse, saved.states, saved.newValues,
                              saved.w});
      return {out, last};
    }
#endif
    Tensor q = toChunks(query, chunk) * scale, k = toChunks(key, chunk), v = toChunks(value, chunk);
    Tensor bt = toChunks(beta.unsqueeze(-1), chunk);
    Tensor cum = toChunks(decay.unsqueeze(-1), chunk).cumsum(3);
    const Masks m(chunk, k.device());
    const ChunkTerms terms = chunkTerms(k, bt, cum, m);
    Tensor system = torch::matmul(k * bt, transposed(k)) * terms.decayPairs * m.strict;
    Tensor inverse = torch::linalg_solve_triangular(system, torch::eye(chunk, system.options()), /*upper=*/false,
                                                    /*left=*/true, /*unitriangular=*/true);
    Tensor w = torch::matmul(inverse, terms.keysWeighted), u = torch::matmul(inverse, v * bt);
    // S_{n+1} = (e^{G_last} I - Kd^T W) S_n + Kd^T U: one batched GEMM per chunk.
    auto [states, s] = chunkStates(transition(terms, w), torch::matmul(transposed(terms.keysToEnd), u),
                                   state.to(torch::kFloat32).reshape({b * h, dk, dv}));
    Tensor newValues = u - torch::matmul(w, states);
    Tensor scores = torch::matmul(q, transposed(k)) * terms.decayPairs;
    Tensor out = torch::matmul(q * terms.gamma, states) + torch::matmul(scores, newValues);
    ctx->save_for_backward({q, k, v, bt, cum, inverse, states, newValues});
    return {fromChunks(out, t, query.scalar_type()), s.view({b, h, dk, dv})};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const Tf32Scope scope(ctx->saved_data["tf32"].toBool());
    std::vector<Tensor> saved = ctx->get_saved_variables();
    const int64_t t = ctx->saved_data["t"].toInt();
    const std::vector<int64_t> dtypes = ctx->saved_data["dtypes"].toIntVector();
    [[maybe_unused]] const bool kernels = ctx->saved_data.count("kernels") > 0;
#ifdef ADAPT_WITH_CUDA_KERNELS
    // Whether a gradient flows through the initial or the final state.
    const bool statesFlow = kernels && (grads[1].defined() || ctx->saved_data["stateGrad"].toBool());
    if (kernels) {
      const cuda::DeltaRuleSaved kept{saved[5], saved[6], saved[7], saved[4], saved[8]};
      const KernelUse whole = backwardKernelUse();
      if (whole == KernelUse::Always || (whole == KernelUse::Checked && !statesFlow)) {
        auto type = [&](int i) { return static_cast<torch::ScalarType>(dtypes[i]); };
        const cuda::DeltaRuleGrads g =
            cuda::gatedDeltaRuleBackward(saved[0], saved[1], saved[2], saved[3], kept, grads[0], grads[1]);
        return {g.query.to(type(0)), g.key.to(type(1)),          g.value.to(type(2)), g.decay.to(type(3)),
                g.beta.to(type(4)),  g.initialState.to(type(5)), Tensor(),            Tensor()};
      }
      saved = chunksFromKernels(saved[0], saved[1], saved[2], saved[3], kept);
    }
#endif
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &bt = saved[3], &cum = saved[4], &inverse = saved[5],
                 &states = saved[6], &newValues = saved[7];
    const int64_t b = k.size(0), h = k.size(1), n = k.size(2), c = k.size(3), dk = k.size(4), dv = v.size(4);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
    const Masks m(c, k.device());
    const ChunkTerms terms = chunkTerms(k, bt, cum, m);
    Tensor dOut = grads[0].defined() ? toChunks(grads[0], c) : torch::zeros_like(newValues);
    Tensor dLast = grads[1].defined() ? grads[1].to(torch::kFloat32).reshape({b * h, dk, dv})
                                      : torch::zeros({b * h, dk, dv}, k.options());
    Tensor xv = v * bt;
    Tensor w = torch::matmul(inverse, terms.keysWeighted);
    Tensor scores = torch::matmul(q, transposed(k)) * terms.decayPairs; // P, decay included
    Tensor queryDecayed = q * terms.gamma;

    // The state's gradient from the last chunk back (one kernel on the GPU).
    Tensor localNewValues = torch::matmul(transposed(scores), dOut); // P^T dO
    Tensor dLeaving, dNew, ds;
#ifdef ADAPT_WITH_CUDA_KERNELS
    // After the bf16 forward kernels; with a state gradient only when asked.
    if (kernels && (!statesFlow || trainingKernelUse() == KernelUse::Always) &&
        cuda::deltaRuleStateBackwardTakes(dk, dv, c))
      std::tie(dLeaving, dNew, ds) = stateGradientsOnGpu(terms.keysToEnd, w, queryDecayed, dOut, localNewValues, cum,
                                                         dLast, /*perChannel=*/false);
#endif
    if (!dLeaving.defined())
      std::tie(dLeaving, dNew, ds) =
          stateGradients(transition(terms, w), terms.keysToEnd, w, queryDecayed, dOut, localNewValues, dLast);

    // Through O = Qd S + P V_new, S' = e^{G_last} S + Kd^T V_new, V_new = U - W S.
    Tensor dQueryDecayed = torch::matmul(dOut, transposed(states));
    Tensor dScores = torch::matmul(dOut, transposed(newValues)) * m.inclusive;
    Tensor dKeysToEnd = torch::matmul(newValues, transposed(dLeaving));
    Tensor dW = -torch::matmul(dNew, transposed(states));
    // Through W = T Xk, U = T Xv and T = (I + A)^-1.
    Tensor dInverse = torch::matmul(dW, transposed(terms.keysWeighted)) + torch::matmul(dNew, transposed(xv));
    Tensor dXk = torch::matmul(transposed(inverse), dW), dXv = torch::matmul(transposed(inverse), dNew);
    Tensor dSystem = -torch::matmul(torch::matmul(transposed(inverse), dInverse), transposed(inverse)) * m.strict;
    // A = diag(b) (K K^T . D) on the strict lower part.
    Tensor keyProducts = torch::matmul(k, transposed(k)) * terms.decayPairs * m.strict; // K K^T . D
    Tensor dKeyProducts = dSystem * bt * terms.decayPairs;                              // d(K K^T) of A

    Tensor dScoresDecayed = dScores * terms.decayPairs;
    Tensor dq = (torch::matmul(dScoresDecayed, k) + dQueryDecayed * terms.gamma) * scale;
    Tensor dKey = torch::matmul(transposed(dScoresDecayed), q) + dKeysToEnd * terms.toEnd +
                dXk * (bt * terms.gamma) + torch::matmul(dKeyProducts, k) +
                torch::matmul(transposed(dKeyProducts), k);
    Tensor dValue = dXv * bt;
    Tensor dBeta = (dSystem * keyProducts).sum(-1, true) + (dXk * k).sum(-1, true) * terms.gamma +
                   (dXv * v).sum(-1, true);
    // The cumulative decay: every e^{+-G} factor, then the chunk's last G.
    Tensor pairScores = dScores * scores, pairSystem = dSystem * keyProducts * bt;
    Tensor keysToEndTerm = (dKeysToEnd * terms.keysToEnd).sum(-1, true);
    Tensor dCum = pairScores.sum(-1, true) - transposed(pairScores.sum(-2, true)) + pairSystem.sum(-1, true) -
                  transposed(pairSystem.sum(-2, true)) + (dQueryDecayed * queryDecayed).sum(-1, true) +
                  (dXk * terms.keysWeighted).sum(-1, true) - keysToEndTerm;
    Tensor dLastCum = keysToEndTerm.sum(3, true) +
                      (dLeaving * states).sum({-1, -2}).view({b, h, n, 1, 1}) * terms.last.exp();
    return chunkedGradients(dq, dKey, dValue, decayGradient(dCum, dLastCum), dBeta, ds, t, dtypes);
  }
};

} // namespace

bool deltaRuleNeedsGraph(const DeltaRuleInputs &in, const Tensor &initialState) {
  return torch::GradMode::is_enabled() &&
         (in.query.requires_grad() || in.key.requires_grad() || in.value.requires_grad() || in.decay.requires_grad() ||
          in.beta.requires_grad() || (initialState.defined() && initialState.requires_grad()));
}

std::vector<Tensor> scalarDecayDeltaRule(const DeltaRuleInputs &in, int64_t chunkSize, const Tensor &initialState,
                                         bool tf32) {
  const int64_t b = in.key.size(0), h = in.key.size(1), dk = in.key.size(3), dv = in.value.size(3);
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (!deltaRuleNeedsGraph(in, initialState) &&
      chooseKernel("gated_delta_rule.no_grad", in.key, forwardKernelEnabled(),
                   cuda::deltaRuleForwardTakes(in.query, in.key, in.value, in.decay, in.beta, chunkSize))) {
    Tensor last;
    Tensor out = cuda::gatedDeltaRuleForward(in.query, in.key, in.value, in.decay, in.beta, initialState, &last);
    return {out, last};
  }
#endif
  Tensor state = initialState.defined() ? initialState
                                        : torch::zeros({b, h, dk, dv}, in.value.options().dtype(torch::kFloat32));
  return DeltaRuleNode::apply(in.query, in.key, in.value, in.decay, in.beta, state, chunkSize, tf32);
}

} // namespace adapt::rt
