//===- ValidateCommand.h - `adapt validate` ---------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_VALIDATECOMMAND_H
#define ADAPT_TOOLS_VALIDATECOMMAND_H

namespace adapt {

/// Usage lines of `adapt validate`, for the CLI's help text.
extern const char *const kValidateUsage;

/// `adapt validate PATH --stage op|model|parallel|full --out DIR [...]`: one
/// stage of the validation ladder, records in DIR. Exit 0 every check passed
/// (or the stage is not run yet), 4 a check failed, 2 bad input.
int runValidateCommand();

} // namespace adapt

#endif // ADAPT_TOOLS_VALIDATECOMMAND_H
