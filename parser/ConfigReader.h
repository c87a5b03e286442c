//===- ConfigReader.h - config.json into a ModelSpec ------------*- C++ -*-===//
//
// Reads a Hugging Face `config.json` of any MoE family into the normalised
// ModelSpec. Families are recognised by the keys they have (and the tensors
// their manifest names), never by `model_type` alone; every key that no rule
// understands lands in ModelSpec::unknownKeys.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_CONFIGREADER_H
#define ADAPT_PARSER_CONFIGREADER_H

#include "parser/InputError.h"
#include "parser/ModelSpec.h"

#include <string>
#include <string_view>

namespace adapt {

/// Reads and normalises the config at \p path. Sibling files the config
/// refers to implicitly (`hf_quant_config.json`) are read from the same folder.
Result<ModelSpec> readModelConfig(const std::string &path);

/// Parses config JSON text; \p fileForErrors names it in error messages.
/// \p hfQuantJson is the text of a sibling hf_quant_config.json, or empty.
Result<ModelSpec> parseModelConfig(std::string_view json,
                                   const std::string &fileForErrors,
                                   std::string_view hfQuantJson = {});

/// Lower-case name of a mixer kind as used in the IR and reports.
const char *mixerKindName(MixerKind kind);

} // namespace adapt

#endif // ADAPT_PARSER_CONFIGREADER_H
