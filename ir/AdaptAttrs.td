//===- AdaptAttrs.td - adapt dialect attributes ------------*- tablegen -*-===//
//
// Closed sets of component choices as enumerations, so that ODS verifies
// them and C++ compares enumerators instead of strings. Only sets the config
// reader can never extend belong here: a config value adapt has not seen
// (a new `scoring_func`, `hidden_act` or `rope_type`) must still import and
// reach the gap report by name, so those attributes stay strings.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_ATTRS_TD
#define ADAPT_ATTRS_TD

include "ir/AdaptDialect.td"
include "mlir/IR/EnumAttr.td"

/// An I32 enumeration whose attribute class is declared by Adapt_EnumAttr.
class Adapt_I32Enum<string name, string summary, list<I32EnumAttrCase> cases>
    : I32EnumAttr<name, summary, cases> {
  let cppNamespace = "::adapt";
  let genSpecializedAttr = 0;
}

/// The attribute of \p enumInfo, printed `#adapt.<mnemonic><value>`.
class Adapt_EnumAttr<EnumAttrInfo enumInfo, string mnemonic>
    : EnumAttr<Adapt_Dialect, enumInfo, mnemonic> {
  let assemblyFormat = "`<` $value `>`";
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def Adapt_AttentionKind : Adapt_I32Enum<"AttentionKind",
    "softmax attention's head layout", [
      I32EnumAttrCase<"Mha", 0, "mha">,
      I32EnumAttrCase<"Gqa", 1, "gqa">,
      I32EnumAttrCase<"Mla", 2, "mla">]> {
  let description = [{
    `mha`: as many key/value heads as query heads; `gqa`: fewer key/value
    heads, each shared by a group of query heads; `mla`: DeepSeek's
    multi-head latent attention (low-rank compressed keys and values).
  }];
}
def Adapt_AttentionKindAttr
    : Adapt_EnumAttr<Adapt_AttentionKind, "attention_kind">;

def Adapt_WindowKind : Adapt_I32Enum<"WindowKind",
    "which keys a query attends to", [
      I32EnumAttrCase<"None", 0, "none">,
      I32EnumAttrCase<"Sliding", 1, "sliding">,
      I32EnumAttrCase<"Chunked", 2, "chunked">]> {
  let description = [{
    `none`: every earlier key; `sliding`: the last `window_size` keys;
    `chunked`: the keys of the query's own `window_size`-token chunk
    (Llama-4).
  }];
}
def Adapt_WindowKindAttr : Adapt_EnumAttr<Adapt_WindowKind, "window">;

def Adapt_QkNormKind : Adapt_I32Enum<"QkNormKind",
    "how q and k are normalised before the dot product", [
      I32EnumAttrCase<"Head", 0, "head">,
      I32EnumAttrCase<"Full", 1, "full">,
      I32EnumAttrCase<"L2", 2, "l2">]> {
  let description = [{
    `head`: RMSNorm over each head (Qwen3, GLM, Hunyuan); `full`: RMSNorm
    over all heads' width (MiniMax-M2); `l2`: a weightless L2 norm (Llama-4).
  }];
}
def Adapt_QkNormKindAttr : Adapt_EnumAttr<Adapt_QkNormKind, "qk_norm_kind">;

def Adapt_LinearAttentionKind : Adapt_I32Enum<"LinearAttentionKind",
    "linear attention's state update", [
      I32EnumAttrCase<"GatedDeltaRule", 0, "gated_delta_rule">,
      I32EnumAttrCase<"KimiDelta", 1, "kimi_delta">,
      I32EnumAttrCase<"Lightning", 2, "lightning">]> {
  let description = [{
    `gated_delta_rule`: Gated DeltaNet (Qwen3-Next, Qwen3.5); `kimi_delta`:
    the same with per-channel decay (Kimi-Linear); `lightning`: decayed
    linear attention in blocks (MiniMax-M1).
  }];
}
def Adapt_LinearAttentionKindAttr
    : Adapt_EnumAttr<Adapt_LinearAttentionKind, "linear_attention_kind">;

//===----------------------------------------------------------------------===//
// Rotary position embedding
//===----------------------------------------------------------------------===//

/// A float parameter with a default, written as a float literal.
class Adapt_F64Parameter<string default, string desc>
    : AttrOrTypeParameter<"::llvm::APFloat", desc> {
  let comparator = "$_lhs.bitwiseIsEqual($_rhs)";
  let defaultValue = "::llvm::APFloat(" # default # ")";
  let parser = [{[&]() -> ::mlir::FailureOr<::llvm::APFloat> {
    double value;
    if ($_parser.parseFloat(value))
      return ::mlir::failure();
    return ::llvm::APFloat(value);
  }()}];
  let printer = "$_printer.printFloat($_self)";
}

/// A bool parameter with a default, written `true` or `false`.
class Adapt_BoolParameter<string default, string desc>
    : AttrOrTypeParameter<"bool", desc> {
  let defaultValue = default;
  let parser = [{[&]() -> ::mlir::FailureOr<bool> {
    if (::mlir::succeeded($_parser.parseOptionalKeyword("true")))
      return true;
    if (::mlir::succeeded($_parser.parseOptionalKeyword("false")))
      return false;
    return $_parser.emitError($_parser.getCurrentLocation(),
                              "expected true or false");
  }()}];
  let printer = [{$_printer << ($_self ? "true" : "false")}];
}

def Adapt_RopeAttr : AttrDef<Adapt_Dialect, "Rope"> {
  let mnemonic = "rope";
  let summary = "Rotary position embedding: its base and scaling";
  let description = [{
    One attribute for the config's rope_theta / rope_scaling, shared by
    adapt.attention and adapt.sparse_attention. `scaling` is the config's
    rope_type as the reader resolved it (`default`, `yarn`, `llama3`,
    `mrope`, `ntk_alpha`, `none` for NoPE); it stays a string because an
    unseen rope_type must still import and be named in the gap report.
    `yarn` reads factor, original_max_positions, beta_fast/slow, mscale,
    mscale_all_dim and truncate; `llama3` reads factor,
    original_max_positions and low/high_freq_factor. Parameters equal to
    their defaults are not printed.
  }];
  let parameters = (ins
    StringRefParameter<"the scaling: default, yarn, llama3, ...">:$scaling,
    Adapt_F64Parameter<"10000.0", "the base">:$theta,
    Adapt_BoolParameter<"false", "rotate adjacent pairs, not halves">:$interleaved,
    Adapt_F64Parameter<"1.0", "context extension factor">:$factor,
    DefaultValuedParameter<"int64_t", "0", "pre-extension context length">:$original_max_positions,
    Adapt_F64Parameter<"32.0", "YaRN">:$beta_fast,
    Adapt_F64Parameter<"1.0", "YaRN">:$beta_slow,
    Adapt_F64Parameter<"1.0", "YaRN">:$mscale,
    Adapt_F64Parameter<"0.0", "YaRN">:$mscale_all_dim,
    Adapt_BoolParameter<"true", "YaRN: truncate the correction range">:$truncate,
    Adapt_F64Parameter<"1.0", "Llama-3">:$low_freq_factor,
    Adapt_F64Parameter<"4.0", "Llama-3">:$high_freq_factor);
  let assemblyFormat = "`<` struct(params) `>`";
}

//===----------------------------------------------------------------------===//
// Checkpoint quantization
//===----------------------------------------------------------------------===//

/// A list parameter, omitted when empty and written in brackets, so that a
/// struct's commas and the list's do not mix: `block = [128, 128]`.
class Adapt_ListParameter<string element, string desc>
    : OptionalArrayRefParameter<element, desc> {
  let parser = [{[&]() -> ::mlir::FailureOr<::llvm::SmallVector<}] # element # [{>> {
    ::llvm::SmallVector<}] # element # [{> items;
    if ($_parser.parseCommaSeparatedList(::mlir::AsmParser::Delimiter::Square, [&]() -> ::mlir::ParseResult {
          auto item = ::mlir::FieldParser<}] # element # [{>::parse($_parser);
          if (::mlir::failed(item))
            return ::mlir::failure();
          items.push_back(*item);
          return ::mlir::success();
        }))
      return ::mlir::failure();
    return items;
  }()}];
  let printer = [{$_printer << '['; ::llvm::interleaveComma($_self, $_printer); $_printer << ']'}];
}

def Adapt_QuantAttr : AttrDef<Adapt_Dialect, "Quant"> {
  let mnemonic = "quant";
  let summary = "The checkpoint's weight format (quantization_config)";
  let description = [{
    What the config's quantization_config (or hf_quant_config.json) says of
    the stored weights, on adapt.model as `adapt.quant`. `method` stays a
    string: an unseen method must still import and be named in the gap
    report (weights.<method>), as unseen values always are. `format` is the
    method's own word for the element type (e4m3, pack-quantized, ...),
    `block` the [rows, cols] of block-scaled formats (DeepSeek FP8: 128x128),
    `group_size` and `bits` those of group-quantized ones, `excluded` the
    modules kept in the compute dtype (modules_to_not_convert / ignore).
    Parameters equal to their defaults are not printed.
  }];
  let parameters = (ins
    StringRefParameter<"the method: fp8, mxfp4, nvfp4, ...">:$method,
    StringRefParameter<"the element format", "\"\"">:$format,
    Adapt_ListParameter<"int64_t", "[rows, cols] of a scale block">:$block,
    DefaultValuedParameter<"int64_t", "0", "elements per scale group">:$group_size,
    DefaultValuedParameter<"int64_t", "0", "bits per element">:$bits,
    Adapt_ListParameter<"::mlir::StringAttr", "modules left unquantized">:$excluded);
  let assemblyFormat = "`<` struct(params) `>`";
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

def Adapt_Routing : Adapt_I32Enum<"Routing",
    "the order of a router's scoring and top-k selection", [
      I32EnumAttrCase<"ScoreTopK", 0, "score_topk">,
      I32EnumAttrCase<"TopKScore", 1, "topk_score">,
      I32EnumAttrCase<"TopKScoreInput", 2, "topk_score_input">]> {
  let description = [{
    `score_topk`: score every expert, then keep the top k (Qwen, Mixtral,
    DeepSeek); `topk_score`: the top k of the logits, then score those k
    (gpt-oss); `topk_score_input`: as `topk_score`, the score scaling the
    expert's input instead of its output (Llama-4).
  }];
}
def Adapt_RoutingAttr : Adapt_EnumAttr<Adapt_Routing, "routing">;

def Adapt_FusedLayout : Adapt_I32Enum<"FusedLayout",
    "how a fused expert gate_up tensor is stored", [
      I32EnumAttrCase<"None", 0, "none">,
      I32EnumAttrCase<"InterleavedInOut", 1, "interleaved_in_out">,
      I32EnumAttrCase<"ConcatInOut", 2, "concat_in_out">,
      I32EnumAttrCase<"ConcatOutIn", 3, "concat_out_in">,
      I32EnumAttrCase<"ConcatInOutConverted", 4, "concat_in_out_converted">]> {
  let description = [{
    `none`: no fused tensor (per-expert gate and up tensors);
    `interleaved_in_out`: [E, H, 2I], gate and up columns alternating
    (gpt-oss); `concat_in_out`: [E, H, 2I], gate then up (Llama-4);
    `concat_out_in`: [E, 2I, H], gate then up; `concat_in_out_converted`:
    [E, H, 2I] on disk, [E, 2I, H] in transformers after its load-time
    transpose (Qwen3-VL-MoE).
  }];
}
def Adapt_FusedLayoutAttr : Adapt_EnumAttr<Adapt_FusedLayout, "fused_layout">;

#endif // ADAPT_ATTRS_TD
