import os
import lit.formats

config.name = "adapt"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.adapt_bin_dir, "..", "tests", "lit-out")
config.environment["FILECHECK_OPTS"] = "-enable-var-scope"
config.environment["PATH"] = os.pathsep.join(
    [config.adapt_bin_dir, config.llvm_tools_dir, config.environment.get("PATH", os.environ["PATH"])])
config.substitutions.append(("%models", os.path.join(config.adapt_source_dir, "..", "shared", "models")))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))
# The runtime's build (made when adapt is configured with the runtime on):
# tests that compile and run a generated trainer need it.
runtime_dir = os.environ.get("ADAPT_RUNTIME_DIR",
                             os.path.join(config.adapt_bin_dir, "..", "runtime"))
if os.path.exists(os.path.join(runtime_dir, "AdaptRuntimeConfig.cmake")):
    config.available_features.add("runtime")
config.substitutions.append(("%runtime_dir", os.path.abspath(runtime_dir)))
