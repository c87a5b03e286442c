//===- AdaptDialect.td - the adapt dialect -----------------*- tablegen -*-===//
//
// One op per model component, at the level a model author thinks in. Weights
// are `adapt.weight` symbols named by their checkpoint tensor names; component
// ops refer to them by symbol so verifiers can check shapes against the
// component's hyper-parameters.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_DIALECT_TD
#define ADAPT_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/IR/OpBase.td"

def Adapt_Dialect : Dialect {
  let name = "adapt";
  let cppNamespace = "::adapt";
  let summary = "Model components of Mixture-of-Experts releases";
  let description = [{
    A model is an `adapt.model` holding its weights (`adapt.weight` symbols)
    and a dataflow graph of components: embedding, norms, attention (MHA, GQA,
    MLA), sparse attention, linear attention, MoE, MLP, MTP, encoders and the
    LM head. Passes attach parameter counts, manifest facts and support status
    as attributes so a reviewer can diff the IR before and after each pass.
  }];
  let useDefaultAttributePrinterParser = 1;
}

class Adapt_Op<string mnemonic, list<Trait> traits = []>
    : Op<Adapt_Dialect, mnemonic, traits>;

def PositiveI64Attr : ConfinedAttr<I64Attr, [IntMinValue<1>]>;
def NonNegativeI64Attr : ConfinedAttr<I64Attr, [IntNonNegative]>;

#endif // ADAPT_DIALECT_TD
