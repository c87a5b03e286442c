// Stands in for the runtime's TrainMain.h so lit can check that generated
// trainers compile against runtime/ModelDef.h without LibTorch.
#include "runtime/ModelDef.h"

#ifdef ADAPT_FAKE_BREAK
#error "this stand-in runtime refuses to compile (a test of exit code 4)"
#endif

#include <string>

namespace adapt::rt {
int trainMain(int argc, char **argv, const ModelDef &def,
              const std::string &defaultModelDir);
} // namespace adapt::rt
