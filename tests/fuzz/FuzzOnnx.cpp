//===- FuzzOnnx.cpp - libFuzzer target for the ONNX reader ----------------===//
//
// Feeds arbitrary bytes to parseOnnxModel (external data resolved against a
// temporary folder holding one zero-filled data file) and maps every graph
// that parses. Seeds: tests/fuzz/corpus/onnx/.
//
//===----------------------------------------------------------------------===//
#include "parser/OnnxModel.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <google/protobuf/stubs/logging.h>

namespace {

/// Deletes baseDir() when the fuzzer exits.
void removeBaseDir();

/// A temporary folder, made once per process, to anchor external data. It
/// holds a 64 KiB `tiny-decoder.onnx.data` so that the seed model's external
/// weights resolve and mutations of it reach the component mapping. Never
/// destroyed, so the exit handler can still read it.
const std::string &baseDir() {
  static const std::string *dir = [] {
    char pattern[] = "/tmp/adapt-fuzz-onnx-XXXXXX";
    const char *made = mkdtemp(pattern);
    if (!made)
      return new std::string("/nonexistent-adapt-fuzz-dir");
    std::ofstream(std::string(made) + "/tiny-decoder.onnx.data",
                  std::ios::binary)
        << std::string(64 * 1024, '\0');
    std::atexit(removeBaseDir);
    return new std::string(made);
  }();
  return *dir;
}

void removeBaseDir() {
  std::error_code ec;
  std::filesystem::remove_all(baseDir(), ec);
}

/// Drops protobuf's log lines, which would only slow the fuzzer down.
void ignoreLog(google::protobuf::LogLevel, const char *, int,
               const std::string &) {}

} // namespace

/// libFuzzer entry point: parse, then map, one input; must never crash.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool quiet = (google::protobuf::SetLogHandler(ignoreLog), true);
  (void)quiet;
  adapt::Result<adapt::OnnxGraph> graph = adapt::parseOnnxModel(
      std::string_view(reinterpret_cast<const char *>(data), size),
      "fuzz.onnx", baseDir());
  if (graph.ok())
    (void)adapt::mapOnnxGraph(*graph);
  return 0;
}
