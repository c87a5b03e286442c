//===- DataCommand.h - `adapt data` ------------------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_DATACOMMAND_H
#define ADAPT_TOOLS_DATACOMMAND_H

namespace adapt {

/// Usage lines of `adapt data`, for the CLI's help text.
extern const char *const kDataUsage;

/// `adapt data IN.jsonl --model DIR --out OUT.jsonl [...]`: text, chat and
/// prompt/completion records tokenized with the model's own tokenizer and
/// chat template into the trainer's JSONL (input_ids, labels). Runs
/// scripts/adapt_data.py (compiled into the binary) with the reference
/// venv's Python: ADAPT_PYTHON, else the source tree's .venv, else python3.
/// Exit 0 done, 2 bad input or usage.
int runDataCommand(int argc, char **argv);

} // namespace adapt

#endif // ADAPT_TOOLS_DATACOMMAND_H
