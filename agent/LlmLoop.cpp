//===- LlmLoop.cpp - ask an LLM for a candidate, compile it, test it -----===//
//
// The loop of `adapt generate` for gaps no reuse rule covers. It talks to an
// OpenAI-compatible Chat Completions endpoint (libcurl) with one tool,
// compile_and_test(source): every call compiles the source as a shared object
// in a child process (time and memory limits) and runs the op stage
// (adapt-candidate-check, another child) on it; compiler errors and failed
// checks go back to the model. The loop stops at the first candidate that
// passes, or when the attempt or token budget is spent. HTTP faults
// (timeouts, 5xx, 429, malformed JSON) are retried with exponential backoff;
// calls to tools that do not exist are answered with an error message. Every
// request, response, source and log is written under the candidate folder.
//
//===----------------------------------------------------------------------===//

#include "agent/Agent.h"
#include "agent/Sandbox.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <thread>

namespace adapt::agent {

std::vector<std::string> staticCheck(const std::string &source) {
  std::vector<std::string> reasons;
  struct Pattern {
    const char *regex, *why;
  };
  static const Pattern patterns[] = {
      {R"(adapt_reference|reference_routing|routingReference|ropeReference|)"
       R"(attentionReference|gluReference|candidate_check)",
       "calls the reference it is compared against"},
      {R"(\badapt\s*::)", "calls into adapt's own library (the op being replaced)"},
      {R"(\bdlopen\b|\bdlsym\b|RTLD_)", "loads symbols at run time (dlopen/dlsym)"},
      {R"(\bextern\b(?!\s+__shared__))", "declares external symbols (extern)"},
      {R"(#\s*include\s*")", "includes local files"},
      {R"(\bsystem\s*\(|\bpopen\b|\bfork\b|\bexec[lv]p?e?\s*\()", "starts processes"},
      {R"(\basm\b|__asm__)", "uses inline assembly"}};
  for (const Pattern &p : patterns)
    if (std::regex_search(source, std::regex(p.regex)))
      reasons.push_back(p.why);
  return reasons;
}

namespace {

size_t collect(char *data, size_t size, size_t count, void *user) {
  static_cast<std::string *>(user)->append(data, size * count);
  return size * count;
}

/// One HTTP exchange's outcome.
struct HttpResult {
  long status = 0;      ///< 0 when no HTTP answer (timeout, refused).
  std::string body, error;
};

HttpResult postJson(const LlmConfig &config, const std::string &body) {
  HttpResult r;
  CURL *curl = curl_easy_init();
  if (!curl) {
    r.error = "libcurl could not start";
    return r;
  }
  std::string url = config.baseUrl;
  while (!url.empty() && url.back() == '/')
    url.pop_back();
  url += "/chat/completions";
  curl_slist *headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!config.apiKey.empty())
    headers = curl_slist_append(headers, ("Authorization: Bearer " + config.apiKey).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, long(body.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, long(config.requestTimeoutS));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK)
    r.error = curl_easy_strerror(rc);
  else
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return r;
}

/// Posts a chat request with retries. Returns the parsed response, or sets
/// \p error (the last fault) after the retries. \p log gets one line per try.
bool chat(const LlmConfig &config, const Json &request, Json &response, std::string &error,
          std::vector<std::string> &log) {
  std::string body = request.dump();
  int delay = config.backoffMs;
  for (int attempt = 0; attempt <= config.retries; ++attempt) {
    if (attempt > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      delay *= 2;
    }
    HttpResult r = postJson(config, body);
    if (!r.error.empty()) {
      error = "endpoint unreachable or timed out: " + r.error;
    } else if (r.status == 429 || r.status >= 500) {
      error = "endpoint answered HTTP " + std::to_string(r.status);
    } else if (r.status != 200) {
      error = "endpoint answered HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300);
      log.push_back("try " + std::to_string(attempt + 1) + ": " + error + " (not retried)");
      return false; // 4xx: retrying the same request will not help.
    } else {
      response = Json::parse(r.body, nullptr, /*allow_exceptions=*/false);
      if (response.is_discarded() || !response.contains("choices") ||
          !response["choices"].is_array() || response["choices"].empty() ||
          !response["choices"][0].contains("message")) {
        error = "malformed response (not a Chat Completions JSON): " + r.body.substr(0, 200);
      } else {
        log.push_back("try " + std::to_string(attempt + 1) + ": ok");
        return true;
      }
    }
    log.push_back("try " + std::to_string(attempt + 1) + ": " + error);
  }
  error += " (after " + std::to_string(config.retries + 1) + " tries)";
  return false;
}

/// Runs \p args with limits, output to \p logPath; returns a description of
/// an abnormal end ("" on exit 0) and sets \p exitCode.
std::string runChild(const std::vector<std::string> &args, const std::string &logPath,
                     int seconds, unsigned memoryMb, int &exitCode) {
  llvm::SmallVector<llvm::StringRef, 16> argv(args.begin(), args.end());
  std::optional<llvm::StringRef> redirects[] = {llvm::StringRef(""), llvm::StringRef(logPath),
                                                llvm::StringRef(logPath)};
  std::string message;
  bool failed = false;
  exitCode = llvm::sys::ExecuteAndWait(args[0], argv, std::nullopt, redirects, seconds,
                                       memoryMb, &message, &failed);
  if (failed)
    return "could not start " + args[0] + ": " + message;
  if (exitCode == -2)
    return "timed out or crashed: " + message;
  if (exitCode < 0)
    return "ended abnormally: " + message;
  return "";
}

/// runChild inside the candidate sandbox (agent/Sandbox.h); "could not
/// start" with the reason when no sandbox can be built on this machine.
std::string runSandboxed(const std::vector<std::string> &args, const std::string &logPath, int seconds,
                         const SandboxLimits &limits, int &exitCode) {
  std::string why;
  std::vector<std::string> cmd = sandboxCommand(args, limits, why);
  if (cmd.empty()) {
    exitCode = -1;
    return "could not start " + args[0] + ": " + why;
  }
  // Limits are prlimit's inside the sandbox; the wall-clock timeout kills
  // bwrap, whose namespace takes every process of the candidate with it.
  std::string abnormal = runChild(cmd, logPath, seconds, 0, exitCode);
  // bwrap reports the sandboxed process's death by signal N as exit 128 + N.
  if (abnormal.empty() && exitCode > 128 && exitCode <= 128 + 64)
    return "crashed (signal " + std::to_string(exitCode - 128) + ")";
  return abnormal;
}

std::string tail(const std::string &path, size_t chars) {
  std::string text;
  readText(path, text);
  return text.size() > chars ? "..." + text.substr(text.size() - chars) : text;
}

/// nvcc from PATH, $CUDA_HOME/bin or /usr/local/cuda/bin; none when absent.
std::optional<std::string> findNvcc() {
  if (auto onPath = llvm::sys::findProgramByName("nvcc"))
    return *onPath;
  std::vector<std::string> dirs;
  if (const char *home = std::getenv("CUDA_HOME"))
    dirs.push_back(std::string(home) + "/bin");
  dirs.push_back("/usr/local/cuda/bin");
  for (const std::string &d : dirs)
    if (llvm::sys::fs::can_execute(d + "/nvcc"))
      return d + "/nvcc";
  return std::nullopt;
}

/// The op's semantics (from the task table) and the library's conventions,
/// for the system prompt.
std::string taskPrompt(const Json &component, const CandidateTask &task,
                       const std::string &irText, const LlmConfig &config) {
  std::ostringstream os;
  os << "You write operators for adapt, a C++17 LibTorch LoRA training runtime.\n\n"
     << "Missing component: " << component.value("id", "") << " (" << component.value("op", "")
     << "; " << component.value("variant", "") << ").\n"
     << "Why it is missing: ";
  for (const Json &r : component.value("reasons", Json::array()))
    os << r.get<std::string>() << " ";
  os << "\n\nIR of the op in this model:\n" << irText << "\n\n"
     << candidateTaskPrompt(task, component, irText) << "\n"
     << "Conventions: define exactly\n"
        "  #include <torch/torch.h>\n"
        "  torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,\n"
        "                                const std::map<std::string, double> &params);\n"
        "Inputs are views: they may be non-contiguous. No other includes of project files, no\n"
        "extern, no dlopen, no processes. Use LibTorch autograd for the backward.\n"
        "Test with the compile_and_test tool: it compiles your source and checks forward and\n"
        "backward against a float64 reference on several shapes (the one shown and shapes you\n"
        "are not shown), relative tolerance 1e-5.\n";
  if (config.target == "cuda")
    os << "\nA CUDA kernel is asked for: the source is a .cu file, compiled with nvcc\n"
          "(-arch=native, C++17) against LibTorch, that defines adapt_candidate as above and\n"
          "does the op's work in at least one __global__ kernel of your own, launched on\n"
          "at::cuda::getCurrentCUDAStream() (#include <ATen/cuda/CUDAContext.h>). The inputs\n"
          "live on the GPU; return the output on the same device. Gradients: differentiable\n"
          "ATen ops around the kernel, or a torch::autograd::Function whose backward you write.\n"
          "The checks run on the GPU against the same float64 reference.\n";
  return os.str();
}

Json toolSchema() {
  return Json::array({Json{
      {"type", "function"},
      {"function",
       {{"name", "compile_and_test"},
        {"description", "Compile a C++ LibTorch source defining adapt_candidate and run the op "
                        "checks; returns compiler errors or check results."},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"source", {{"type", "string"}, {"description", "whole C++ file"}}}}},
          {"required", Json::array({"source"})}}}}}}});
}

} // namespace

namespace {

/// The loop itself; \p record is filled as it goes (the caller catches).
Json runLoop(const Json &component, const CandidateTask &task, const std::string &irText,
             const LlmConfig &config, const CandidateTools &tools, const std::string &dir,
             Json &record) {
  record = {{"id", component.value("id", "")},
                 {"component", component.value("id", "")},
                 {"op", component.value("op", "")},
                 {"features", component.value("features", Json::object())},
                 {"kind", "llm"},
                 {"rule", nullptr},
                 {"task", task.name},
                 {"task_feature", task.feature},
                 {"critical", isCriticalOp(component.value("op", ""))},
                 {"status", "failed"},
                 {"reason", ""},
                 {"endpoint", config.baseUrl},
                 {"model", config.model},
                 {"target", config.target},
                 {"files", Json::array()},
                 {"attempts", Json::array()},
                 {"tokens", {{"prompt", 0}, {"completion", 0}, {"total", 0}}},
                 {"flags", Json::array()}};
  std::string error;
  std::string flagsLog = dir + "/compile-flags.log";
  int code = 0;
  std::string flags;
  if (tools.checker.empty() || !llvm::sys::fs::exists(tools.checker)) {
    record["reason"] = "no op-stage checker (adapt-candidate-check): build the runtime";
    return record;
  }
  llvm::sys::fs::create_directories(dir);
  if (!runChild({tools.checker, "--compile-flags"}, flagsLog, 30, 0, code).empty() || code != 0 ||
      !readText(flagsLog, flags)) {
    record["reason"] = "adapt-candidate-check --compile-flags failed";
    return record;
  }
  while (!flags.empty() && (flags.back() == '\n' || flags.back() == ' '))
    flags.pop_back();
  // A CUDA candidate is compiled with nvcc and run on a GPU; where either is
  // missing nobody could test it, so the model is not asked.
  const bool cuda = config.target == "cuda";
  std::string compiler = tools.compiler;
  if (cuda) {
    std::string why;
    if (auto nvcc = findNvcc())
      compiler = *nvcc;
    else
      why = "no CUDA compiler (nvcc on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin)";
    std::string cudaLog = dir + "/cuda-available.log";
    if (why.empty() &&
        (!runChild({tools.checker, "--cuda-available"}, cudaLog, 60, 0, code).empty() || code != 0))
      why = "no CUDA device visible to LibTorch";
    if (why.empty() &&
        (!runChild({tools.checker, "--cuda-compile-flags"}, flagsLog, 30, 0, code).empty() ||
         code != 0 || !readText(flagsLog, flags)))
      why = "adapt-candidate-check --cuda-compile-flags failed";
    if (!why.empty()) {
      record["reason"] = "--target cuda: " + why +
                         " on this machine; CUDA candidates are compiled and checked on a GPU "
                         "(run adapt generate --target cuda there, or use --target libtorch)";
      return record;
    }
    while (!flags.empty() && (flags.back() == '\n' || flags.back() == ' '))
      flags.pop_back();
  }
  const std::string ext = cuda ? ".cu" : ".cpp";
  // What the sandboxed compiler and checker see read-only: LibTorch (from
  // the flags) and the checker's own folder.
  std::vector<std::string> sandboxFolders = foldersOfFlags(flags);
  if (std::string checkerDir = llvm::sys::path::parent_path(tools.checker).str(); !checkerDir.empty()) {
    llvm::SmallString<256> real;
    if (!llvm::sys::fs::real_path(checkerDir, real))
      sandboxFolders.push_back(std::string(real));
  }
  // LibTorch candidates are also checked on the GPU when one is visible.
  bool gpuVisible = false;
  if (!cuda)
    gpuVisible = runChild({tools.checker, "--cuda-available"}, dir + "/cuda-available.log", 60, 0,
                          code)
                     .empty() &&
                 code == 0;

  Json messages = Json::array(
      {Json{{"role", "system"}, {"content", taskPrompt(component, task, irText, config)}},
       Json{{"role", "user"},
            {"content", "Write the candidate and test it with compile_and_test."}}});
  int64_t tokens = 0;
  std::string lastFailure = "the model proposed no source";
  for (int turn = 1; turn <= config.maxAttempts; ++turn) {
    if (tokens >= config.maxTokens) {
      lastFailure = "token budget spent (" + std::to_string(tokens) + " tokens)";
      break;
    }
    Json request = {{"model", config.model}, {"messages", messages}, {"tools", toolSchema()},
                    {"tool_choice", "auto"}, {"temperature", 0.2}};
    std::string tn = std::to_string(turn);
    writeText(dir + "/llm/request-" + tn + ".json", request.dump(2), error);
    Json response;
    std::vector<std::string> httpLog;
    bool ok = chat(config, request, response, error, httpLog);
    Json attempt = {{"turn", turn}, {"http", httpLog}};
    if (!ok) {
      attempt["result"] = error;
      record["attempts"].push_back(attempt);
      lastFailure = error;
      break; // The endpoint is down after retries: stop, nothing else affected.
    }
    writeText(dir + "/llm/response-" + tn + ".json", response.dump(2), error);
    if (response.contains("usage") && response["usage"].is_object()) {
      int64_t p = response["usage"].value("prompt_tokens", 0);
      int64_t c = response["usage"].value("completion_tokens", 0);
      record["tokens"]["prompt"] = record["tokens"]["prompt"].get<int64_t>() + p;
      record["tokens"]["completion"] = record["tokens"]["completion"].get<int64_t>() + c;
      tokens += p + c;
      record["tokens"]["total"] = tokens;
    }
    Json message = response["choices"][0]["message"];
    if (!message.is_object()) {
      attempt["result"] = "malformed response: message is not an object";
      record["attempts"].push_back(attempt);
      lastFailure = attempt["result"];
      continue;
    }
    Json assistant = {{"role", "assistant"}, {"content", message.value("content", Json(""))}};
    if (message.contains("tool_calls") && message["tool_calls"].is_array())
      assistant["tool_calls"] = message["tool_calls"];
    messages.push_back(assistant);
    if (!assistant.contains("tool_calls") || assistant["tool_calls"].empty()) {
      attempt["result"] = "no tool call";
      record["attempts"].push_back(attempt);
      messages.push_back({{"role", "user"},
                          {"content", "Call compile_and_test with your source."}});
      lastFailure = "the model answered without calling compile_and_test";
      continue;
    }
    bool passed = false;
    for (const Json &call : assistant["tool_calls"]) {
      if (!call.is_object()) {
        attempt["result"] = "malformed tool call";
        lastFailure = "the model sent a malformed tool call";
        continue;
      }
      std::string callId = call.value("id", "call");
      std::string name = call.contains("function") ? call["function"].value("name", "") : "";
      std::string reply;
      // Arguments are a JSON string per the API; some servers send an object.
      Json args;
      if (call.contains("function") && call["function"].contains("arguments")) {
        const Json &raw = call["function"]["arguments"];
        args = raw.is_string() ? Json::parse(raw.get<std::string>(), nullptr, false) : raw;
      }
      if (!args.is_object())
        args = Json(Json::value_t::discarded);
      if (name != "compile_and_test") {
        reply = "error: there is no tool '" + name + "'; the only tool is compile_and_test";
        attempt["result"] = "called unknown tool '" + name + "'";
        lastFailure = attempt["result"];
      } else if (args.is_discarded() || !args.contains("source") || !args["source"].is_string()) {
        reply = "error: compile_and_test expects JSON arguments {\"source\": \"...\"}";
        attempt["result"] = "malformed tool arguments";
        lastFailure = attempt["result"];
      } else {
        std::string source = args["source"];
        std::string src = "attempt-" + tn + "/candidate" + ext;
        writeText(dir + "/" + src, source, error);
        std::vector<std::string> refused = staticCheck(source);
        if (cuda && !std::regex_search(source, std::regex(R"(__global__)")))
          refused.push_back("defines no __global__ kernel (a CUDA kernel was asked for)");
        if (!refused.empty()) {
          std::string why;
          for (const std::string &r : refused)
            why += (why.empty() ? "" : "; ") + r;
          reply = "refused by the static check: " + why;
          attempt["result"] = "static check: " + why;
          lastFailure = attempt["result"];
        } else {
          // Compile: the candidate plus the entry point the checker looks up.
          std::string build = dir + "/attempt-" + tn + "/build" + ext;
          writeText(build, "#line 1 \"candidate" + ext + "\"\n" + source +
                               "\nextern \"C\" void *adapt_candidate_entry() {\n"
                               "  return reinterpret_cast<void *>(&adapt_candidate);\n}\n",
                    error);
          const std::string attemptDir = dir + "/attempt-" + tn;
          std::string so = attemptDir + "/candidate.so";
          std::string compileLog = dir + "/attempt-" + tn + "/compile.log";
          auto compilerPath = llvm::sys::findProgramByName(compiler);
          std::vector<std::string> cmd = {compilerPath ? *compilerPath : compiler};
          std::istringstream fs(flags);
          for (std::string w; fs >> w;)
            cmd.push_back(w);
          cmd.insert(cmd.begin() + 1, {build, "-o", so});
          // The compiler reads the candidate's #includes: it runs confined too.
          const int compileSeconds = std::max(config.testTimeoutS * 3, 300);
          SandboxLimits compileLimits{attemptDir, sandboxFolders, compileSeconds, 8192};
          std::string abnormal = runSandboxed(cmd, compileLog, compileSeconds, compileLimits, code);
          if (!abnormal.empty() || code != 0) {
            reply = "compile failed" + (abnormal.empty() ? "" : " (" + abnormal + ")") + ":\n" +
                    tail(compileLog, 3000);
            attempt["result"] = "did not compile";
            lastFailure = "did not compile: " + tail(compileLog, 300);
          } else {
            // The op stage on every device this machine has: a LibTorch
            // composite that passes on the CPU can still fail on a GPU (a
            // tensor made on the CPU, a dtype the CUDA kernels lack).
            std::vector<std::string> devices = {cuda ? "cuda" : "cpu"};
            if (!cuda && gpuVisible)
              devices.push_back("cuda");
            Json result;
            std::string why;
            std::string testLog;
            for (const std::string &device : devices) {
              std::string suffix = device == devices.front() ? "" : "-" + device;
              // Run (sandboxed): the candidate's outputs. Judge (here, never
              // loading it): the verdict, written where the candidate cannot.
              std::string outputs = attemptDir + "/outputs" + suffix + ".safetensors";
              std::string resultPath = dir + "/verdict-" + tn + suffix + ".json";
              testLog = attemptDir + "/test" + suffix + ".log";
              std::vector<std::string> params = candidateCheckerParams(task, component, irText);
              std::vector<std::string> test = {tools.checker, "--task", task.name, "--library", so,
                                               "--emit", outputs, "--device", device};
              test.insert(test.end(), params.begin(), params.end());
              SandboxLimits testLimits{attemptDir, sandboxFolders, config.testTimeoutS,
                                       uint64_t(config.testMemoryMb)};
              abnormal = runSandboxed(test, testLog, config.testTimeoutS, testLimits, code);
              if (abnormal.empty()) {
                std::vector<std::string> judge = {tools.checker, "--task", task.name, "--judge", outputs,
                                                  "--out", resultPath, "--device", device};
                judge.insert(judge.end(), params.begin(), params.end());
                int judged = 0;
                std::string judgeFault = runChild(judge, dir + "/verdict-" + tn + suffix + ".log",
                                                  config.testTimeoutS, 0, judged);
                if (!judgeFault.empty())
                  abnormal = "judge " + judgeFault;
              }
              std::string resultText;
              Json one = readText(resultPath, resultText)
                             ? Json::parse(resultText, nullptr, false)
                             : Json();
              if (!abnormal.empty() || one.is_discarded() || one.is_null()) {
                why = (abnormal.empty() ? "the test ended without a result (exit " +
                                              std::to_string(code) + ")"
                                        : "the test " + abnormal) +
                      " on " + device;
                break;
              }
              if (result.is_null())
                result = one;
              else
                result[device] = one; // The further device's full record.
              result["devices"].push_back(device);
              if (one.value("status", "") != "passed") {
                if (device != devices.front()) {
                  result["status"] = "failed";
                  result["reason"] = "passed on " + devices.front() + ", failed on " + device;
                  for (const Json &c : one["checks"])
                    result["checks"].push_back(Json{
                        {"shape", c.value("shape", "") + " on " + device},
                         {"status", c.value("status", "")},
                         {"forward_max_rel_error", c.value("forward_max_rel_error", 0.0)},
                         {"backward_max_rel_error", c.value("backward_max_rel_error", 0.0)},
                         {"detail", c.value("detail", "")}});
                }
                break;
              }
            }
            if (!why.empty()) {
              reply = why + "\n" + tail(testLog, 1500);
              attempt["result"] = why;
              lastFailure = why;
            } else {
              attempt["validation"] = result;
              passed = result.value("status", "") == "passed";
              reply = "checks: " + result["checks"].dump();
              attempt["result"] = passed ? "passed" : "validation failed";
              if (!passed) {
                lastFailure = "validation failed";
                for (const Json &c : result["checks"])
                  if (c.value("status", "") != "passed") {
                    lastFailure += ": " + c.value("shape", "") + ": " + c.value("detail", "");
                    break;
                  }
                if (result.contains("reason"))
                  lastFailure += ": " + result.value("reason", "");
              } else {
                writeText(dir + "/candidate" + ext, source, error);
                record["files"] = Json::array({"candidate" + ext});
                double speedup = result.value("speedup_over_composite", 0.0);
                result["flag_speedup_threshold"] = config.flagSpeedup;
                record["validation"] = result;
                if (speedup > config.flagSpeedup) {
                  std::ostringstream flag;
                  flag.precision(3);
                  flag << "speed-up " << speedup << "x over the composite baseline (threshold "
                       << config.flagSpeedup << "x): flagged for review, not trusted";
                  record["flags"].push_back(flag.str());
                }
              }
            }
          }
        }
      }
      messages.push_back({{"role", "tool"}, {"tool_call_id", callId}, {"content", reply}});
      writeText(dir + "/attempt-" + tn + "/tool-reply.txt", reply, error);
      if (passed)
        break;
    }
    record["attempts"].push_back(attempt);
    if (passed) {
      record["status"] = "validated";
      record["reason"] = "passed the op stage (task " + task.name + ": forward + backward, " +
                         std::to_string(record["validation"]["checks"].size()) +
                         " shapes incl. unseen ones, poisoned inputs) and the static check";
      return record;
    }
  }
  record["reason"] = lastFailure;
  if (record["attempts"].size() >= size_t(config.maxAttempts))
    record["reason"] = lastFailure + " (attempt budget of " +
                       std::to_string(config.maxAttempts) + " spent)";
  return record;
}

} // namespace

Json generateCandidate(const Json &component, const CandidateTask &task,
                       const std::string &irText, const LlmConfig &config,
                       const CandidateTools &tools, const std::string &dir) {
  Json record;
  try {
    return runLoop(component, task, irText, config, tools, dir, record);
  } catch (const std::exception &e) {
    // A response shaped unlike the API (wrong types deep inside): this
    // candidate fails, nothing else is affected.
    record["status"] = "failed";
    record["reason"] = std::string("malformed response or internal error: ") + e.what();
    return record;
  }
}

} // namespace adapt::agent
