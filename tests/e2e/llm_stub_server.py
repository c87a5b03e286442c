#!/usr/bin/env python3
"""A scripted OpenAI-compatible Chat Completions server for the generate tests.

It replays fixed responses: the request's "model" names a scenario, and the
n-th request of that scenario gets the scenario's n-th step (the last step
repeats). A step is a candidate source (answered as a compile_and_test tool
call), or a fault: HTTP 500/503, malformed JSON, a call to a tool that does
not exist, or a response slower than the client's timeout. Every request is
appended to REQUESTS_LOG (one JSON per line) so tests can see what the loop
fed back. Prints the port on stdout; port 0 picks a free one.

usage: llm_stub_server.py PORT REQUESTS_LOG
"""
import http.server
import json
import sys
import threading
import time

HEADER = "#include <torch/torch.h>\n#include <limits>\n"

CORRECT = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  torch::Tensor logits = inputs[0].contiguous(), bias = inputs[1].contiguous();
  int64_t topK = int64_t(params.at("top_k")), groups = int64_t(params.at("n_group"));
  int64_t keep = int64_t(params.at("topk_group"));
  torch::Tensor scores = params.at("scoring") != 0 ? torch::sigmoid(logits)
                                                   : torch::softmax(logits, -1);
  torch::Tensor choice = scores.detach();
  if (params.at("use_bias") != 0)
    choice = choice + bias;
  int64_t T = logits.size(0), E = logits.size(1);
  if (groups > 1) {
    int64_t per = E / groups;
    torch::Tensor g =
        std::get<0>(choice.view({T, groups, per}).topk(std::min<int64_t>(2, per), -1)).sum(-1);
    torch::Tensor kept = torch::zeros({T, groups}, choice.options())
                             .scatter(1, std::get<1>(g.topk(keep, -1)), 1.0);
    torch::Tensor mask = kept.unsqueeze(-1).expand({T, groups, per}).reshape({T, E});
    choice = choice.masked_fill(mask == 0, -std::numeric_limits<float>::infinity());
  }
  torch::Tensor idx = std::get<1>(choice.topk(topK, -1));
  torch::Tensor w = scores.gather(1, idx);
  if (params.at("norm_topk_prob") != 0)
    w = w / (w.sum(-1, true) + 1e-20);
  w = w * params.at("routed_scaling_factor");
  return torch::zeros_like(scores).scatter(1, idx, w);
}
"""

# Numerically wrong: forgets the group limit and the normalisation.
WRONG = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  torch::Tensor scores = torch::softmax(inputs[0], -1);
  torch::Tensor idx = std::get<1>((scores.detach() + inputs[1]).topk(int64_t(params.at("top_k")), -1));
  return torch::zeros_like(scores).scatter(1, idx, scores.gather(1, idx));
}
"""

NOT_COMPILING = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  return torch::softmax(inputs[0], -1) * undeclared_scale
}
"""

# Cheats: calls the reference it is compared against.
CHEAT = HEADER + r"""
extern torch::Tensor adapt_reference_routing(const torch::Tensor &, const torch::Tensor &);
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  return adapt_reference_routing(inputs[0], inputs[1]);
}
"""

CRASH = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  volatile int *nowhere = nullptr;
  *nowhere = 1;
  return inputs[0];
}
"""

# The end of a candidate that never returns (the sandbox must time it out).
SPIN_FOREVER = r"""  volatile bool forever = true;
  while (forever) {
  }
  return inputs[0];
}
"""

HANG = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
""" + SPIN_FOREVER

# --- the other op-stage tasks (rope, attention_core, glu_activation) ---

ROPE_CORRECT = HEADER + r"""
#include <cmath>
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  auto get = [&](const char *key, double fallback) {
    auto it = params.find(key);
    return it == params.end() ? fallback : it->second;
  };
  torch::Tensor x = inputs[0], positions = inputs[1];
  int64_t rotary = int64_t(get("rotary_dim", double(x.size(2)))), half = rotary / 2;
  double theta = get("theta", 10000), scaling = get("scaling", 0), attention = 1.0;
  torch::Tensor inv =
      1.0 / torch::pow(theta, torch::arange(0, rotary, 2, torch::kFloat64) / double(rotary));
  if (scaling == 1) {  // yarn
    double factor = get("factor", 1), original = get("original_max_position_embeddings", 4096);
    double ms = get("mscale", 0), msAll = get("mscale_all_dim", 0);
    auto m = [](double s, double k) { return s <= 1 ? 1.0 : 0.1 * k * std::log(s) + 1.0; };
    attention = get("attention_factor", 0);
    if (attention == 0)
      attention = (ms != 0 && msAll != 0) ? m(factor, ms) / m(factor, msAll) : m(factor, 1);
    auto correction = [&](double r) {
      return rotary * std::log(original / (r * 2 * M_PI)) / (2 * std::log(theta));
    };
    double lo = correction(get("beta_fast", 32)), hi = correction(get("beta_slow", 1));
    if (get("truncate", 1) != 0) {
      lo = std::floor(lo);
      hi = std::ceil(hi);
    }
    lo = std::max(lo, 0.0);
    hi = std::min(hi, double(rotary - 1));
    if (lo == hi)
      hi += 0.001;
    torch::Tensor ramp = ((torch::arange(half, torch::kFloat64) - lo) / (hi - lo)).clamp(0, 1);
    inv = inv / factor * ramp + inv * (1 - ramp);
  } else if (scaling == 2) {  // llama3
    double factor = get("factor", 8), lf = get("low_freq_factor", 1);
    double hf = get("high_freq_factor", 4), original = get("original_max_position_embeddings", 8192);
    torch::Tensor wavelen = 2 * M_PI / inv;
    torch::Tensor smooth = (original / wavelen - lf) / (hf - lf);
    torch::Tensor mid = (1 - smooth) * inv / factor + smooth * inv;
    inv = torch::where(wavelen < original / hf, inv,
                       torch::where(wavelen > original / lf, inv / factor, mid));
  }
  torch::Tensor axis = torch::zeros({half}, torch::kLong);
  if (get("mrope", 0) != 0) {
    torch::Tensor j = torch::arange(half);
    axis = axis.masked_fill((j % 3 == 1) & (j < 3 * int64_t(get("mrope_section_h", 0))), 1);
    axis = axis.masked_fill((j % 3 == 2) & (j < 3 * int64_t(get("mrope_section_w", 0))), 2);
  }
  torch::Tensor angles = positions.index_select(0, axis).t().to(torch::kFloat64) * inv;
  torch::Tensor c = (angles.cos() * attention).to(x.scalar_type()).unsqueeze(1);
  torch::Tensor s = (angles.sin() * attention).to(x.scalar_type()).unsqueeze(1);
  torch::Tensor rot = x.narrow(2, 0, rotary), rest = x.narrow(2, rotary, x.size(2) - rotary);
  if (get("interleaved", 0) != 0) {
    torch::Tensor a = rot.slice(2, 0, rotary, 2), b = rot.slice(2, 1, rotary, 2);
    return torch::cat({torch::stack({a * c - b * s, b * c + a * s}, -1).flatten(2), rest}, 2);
  }
  torch::Tensor a = rot.narrow(2, 0, half), b = rot.narrow(2, half, half);
  return torch::cat({a * c - b * s, b * c + a * s, rest}, 2);
}
"""

# Numerically wrong: Qwen2-VL's contiguous M-RoPE sections instead of
# Qwen3-VL's interleaved allocation.
ROPE_WRONG = ROPE_CORRECT.replace(
    """    axis = axis.masked_fill((j % 3 == 1) & (j < 3 * int64_t(get("mrope_section_h", 0))), 1);
    axis = axis.masked_fill((j % 3 == 2) & (j < 3 * int64_t(get("mrope_section_w", 0))), 2);""",
    """    int64_t t = int64_t(get("mrope_section_t", 0)), h = int64_t(get("mrope_section_h", 0));
    axis = axis.masked_fill(j >= t, 1).masked_fill(j >= t + h, 2);""")
assert ROPE_WRONG != ROPE_CORRECT

ATTENTION_CORRECT = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  torch::Tensor q = inputs[0].transpose(0, 1), k = inputs[1].transpose(0, 1);
  torch::Tensor v = inputs[2].transpose(0, 1), sinks = inputs[3];
  int64_t T = q.size(1), heads = q.size(0), repeat = heads / k.size(0);
  k = k.repeat_interleave(repeat, 0);
  v = v.repeat_interleave(repeat, 0);
  torch::Tensor logits = q.matmul(k.transpose(1, 2)) * params.at("scale");
  torch::Tensor i = torch::arange(T, q.options().dtype(torch::kLong)).unsqueeze(1),
                j = torch::arange(T, q.options().dtype(torch::kLong)).unsqueeze(0);
  torch::Tensor visible = j <= i;
  int64_t window = int64_t(params.at("window"));
  if (window > 0)
    visible = visible & (j > i - window);
  logits = logits.masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity());
  if (params.at("use_sinks") != 0)
    logits = torch::cat({logits, SINKS.reshape({heads, 1, 1}).expand({heads, T, 1})}, -1);
  torch::Tensor p = torch::softmax(logits, -1).narrow(-1, 0, T);
  return p.matmul(v).transpose(0, 1);
}
"""
# Numerically wrong: the sliding window one key too wide (s >= t - window).
ATTENTION_WRONG = ATTENTION_CORRECT.replace("(j > i - window)", "(j >= i - window)")
ATTENTION_CORRECT, ATTENTION_DETACHED_SINKS = (ATTENTION_CORRECT.replace("SINKS", "sinks"),
                                              ATTENTION_CORRECT.replace("SINKS", "sinks.detach()"))
ATTENTION_WRONG = ATTENTION_WRONG.replace("SINKS", "sinks")
# Correct on the CPU, broken on a GPU: its mask is made on the CPU. Only the
# op stage on a GPU catches it (bench/h200_candidates.sh).
ATTENTION_CPU_MASK = ATTENTION_CORRECT.replace(
    "torch::arange(T, q.options().dtype(torch::kLong))", "torch::arange(T)")
assert ATTENTION_CPU_MASK != ATTENTION_CORRECT

GLU_CORRECT = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  torch::Tensor gate = inputs[0], up = inputs[1];
  if (params.at("clamped") == 0)
    return torch::silu(gate) * up;
  double alpha = params.at("alpha"), limit = params.at("limit");
  gate = gate.clamp_max(limit);
  up = up.clamp(-limit, limit);
  return (up + 1) * gate * torch::sigmoid(gate * alpha);
}
"""
# Numerically wrong: forgets gpt-oss's +1 on up.
GLU_WRONG = GLU_CORRECT.replace("(up + 1) *", "up *")
# Reads its inputs as if they were contiguous: the poisoned views catch it.
GLU_CONTIGUOUS = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  torch::Tensor gate = torch::from_blob(inputs[0].data_ptr<float>(), inputs[0].sizes());
  torch::Tensor up = torch::from_blob(inputs[1].data_ptr<float>(), inputs[1].sizes());
  double alpha = params.at("alpha"), limit = params.at("limit");
  gate = gate.clamp_max(limit);
  up = up.clamp(-limit, limit);
  return (up + 1) * gate * torch::sigmoid(gate * alpha);
}
"""

# CUDA (--target cuda): the routing with expert selection in a __global__
# kernel of its own (one block per token), weights through differentiable ATen
# ops around it. Checked on a GPU (tests/device/cuda_candidates.sh).
CUDA_CORRECT = r"""#include <torch/torch.h>
#include <ATen/cuda/CUDAContext.h>
#include <limits>

// One block per token; thread 0 picks the groups, then the experts, by the
// selection scores (scores + bias), writing top_k expert ids.
__global__ void select_experts(const float *choice, int64_t experts, int64_t groups,
                               int64_t keep_groups, int64_t top_k, int64_t *out) {
  if (threadIdx.x != 0)
    return;
  const int64_t token = blockIdx.x;
  const float *row = choice + token * experts;
  const int64_t per = experts / groups;
  bool group_kept[64];
  for (int64_t g = 0; g < groups; ++g)
    group_kept[g] = groups <= 1;
  if (groups > 1) {
    float group_score[64];
    for (int64_t g = 0; g < groups; ++g) {
      float first = -INFINITY, second = -INFINITY;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        float v = row[e];
        if (v > first) { second = first; first = v; }
        else if (v > second) second = v;
      }
      group_score[g] = first + (per > 1 ? second : 0.0f);
    }
    for (int64_t i = 0; i < keep_groups; ++i) {
      int64_t best = -1;
      for (int64_t g = 0; g < groups; ++g)
        if (!group_kept[g] && (best < 0 || group_score[g] > group_score[best]))
          best = g;
      group_kept[best] = true;
    }
  }
  bool taken[1024];
  for (int64_t e = 0; e < experts; ++e)
    taken[e] = false;
  for (int64_t i = 0; i < top_k; ++i) {
    int64_t best = -1;
    for (int64_t e = 0; e < experts; ++e)
      if (group_kept[e / per] && !taken[e] && (best < 0 || row[e] > row[best]))
        best = e;
    taken[best] = true;
    out[token * top_k + i] = best;
  }
}

torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  torch::Tensor logits = inputs[0].contiguous(), bias = inputs[1].contiguous();
  TORCH_CHECK(logits.is_cuda(), "this candidate runs on CUDA");
  const int64_t tokens = logits.size(0), experts = logits.size(1);
  const int64_t top_k = int64_t(params.at("top_k")), groups = int64_t(params.at("n_group"));
  const int64_t keep = int64_t(params.at("topk_group"));
  TORCH_CHECK(experts <= 1024 && groups <= 64, "at most 1024 experts and 64 groups");
  torch::Tensor scores = params.at("scoring") != 0 ? torch::sigmoid(logits)
                                                   : torch::softmax(logits, -1);
  torch::Tensor choice = scores.detach().to(torch::kFloat32);
  if (params.at("use_bias") != 0)
    choice = choice + bias.to(torch::kFloat32);
  choice = choice.contiguous();
  torch::Tensor idx = torch::empty({tokens, top_k}, logits.options().dtype(torch::kInt64));
  if (tokens > 0)
    select_experts<<<tokens, 32, 0, at::cuda::getCurrentCUDAStream()>>>(
        choice.data_ptr<float>(), experts, groups, keep, top_k, idx.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  torch::Tensor w = scores.gather(1, idx);
  if (params.at("norm_topk_prob") != 0)
    w = w / (w.sum(-1, true) + 1e-20);
  w = w * params.at("routed_scaling_factor");
  return torch::zeros_like(scores).scatter(1, idx, w);
}
"""
# Numerically wrong on the GPU: the kernel ignores the group limit.
CUDA_WRONG = CUDA_CORRECT.replace("if (group_kept[e / per] && !taken[e]", "if (!taken[e]")
# A ".cu" with no kernel of its own is refused: the composite was not asked for.
CUDA_NO_KERNEL = CORRECT

# Escapes the candidate sandbox must hold (issue 14): a shell through
# (std::system), writes to /tmp, to the candidate's record folder and above,
# a grandchild left behind, then a hang until the timeout.
ESCAPE = HEADER + r"""
#include <cstdio>
#include <cstdlib>
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  (std::system)("echo pwned > /tmp/adapt-escape-system; echo pwned > ../adapt-escape-parent; "
                "echo pwned > ../../adapt-escape-grandparent; sleep 4242 &");
  if (FILE *f = std::fopen("/tmp/adapt-escape-fopen", "w")) {
    std::fputs("pwned", f);
    std::fclose(f);
  }
""" + SPIN_FOREVER
# Writes a passing verdict wherever one might be read, then exits 0 before
# producing any output: the judge must not believe it.
FORGE = HEADER + r"""
#include <cstdio>
#include <cstdlib>
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  const char *passed = "{\"status\": \"passed\", \"task\": \"moe_routing\", \"checks\": []}";
  for (const char *path : {"test.json", "verdict-1.json", "../verdict-1.json", "../test.json"})
    if (FILE *f = std::fopen(path, "w")) {
      std::fputs(passed, f);
      std::fclose(f);
    }
  std::exit(0);
}
"""
# A file outside the sandbox pulled in by the preprocessor: its lines would
# go back to the endpoint in the compiler's errors.
INCLUDE_SECRET = "#include </etc/passwd>\n" + HEADER

SCENARIOS = {
    "escape": [ESCAPE],
    "forge": [FORGE],
    "include_secret": [INCLUDE_SECRET, CORRECT],
    "correct": [CORRECT],
    "wrong": [WRONG],
    "noncompiling": [NOT_COMPILING],
    "repair": [NOT_COMPILING, CORRECT],
    "cheat": [CHEAT],
    "crash": [CRASH],
    "hang": [HANG],
    "faults": [("status", 500), ("malformed",), ("tool", "run_shell"), CORRECT],
    "down": [("status", 503)],
    "slow": [("sleep", 5.0)],
    "rope_correct": [ROPE_CORRECT],
    "rope_wrong": [ROPE_WRONG],
    "attention_correct": [ATTENTION_CORRECT],
    "attention_wrong": [ATTENTION_WRONG],
    "attention_detached_sinks": [ATTENTION_DETACHED_SINKS],
    "cuda_correct": [CUDA_CORRECT],
    "cuda_wrong": [CUDA_WRONG],
    "cuda_no_kernel": [CUDA_NO_KERNEL],
    "glu_correct": [GLU_CORRECT],
    "glu_wrong": [GLU_WRONG],
    "glu_contiguous": [GLU_CONTIGUOUS],
}

counters = {}
lock = threading.Lock()


def tool_call_response(name, source, n):
    return {
        "id": "chatcmpl-%d" % n,
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [{
                    "id": "call_%d" % n,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps({"source": source})},
                }],
            },
        }],
        "usage": {"prompt_tokens": 1000 + n, "completion_tokens": 300, "total_tokens": 1300 + n},
    }


class Handler(http.server.BaseHTTPRequestHandler):
    log_path = None

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            request = json.loads(body)
        except ValueError:
            self.send_error(400)
            return
        scenario = request.get("model", "correct")
        with lock:
            n = counters.get(scenario, 0)
            counters[scenario] = n + 1
            with open(self.log_path, "a") as log:
                log.write(json.dumps({"scenario": scenario, "n": n, "path": self.path,
                                      "request": request}) + "\n")
        steps = SCENARIOS.get(scenario, [CORRECT])
        step = steps[min(n, len(steps) - 1)]
        if isinstance(step, str):
            self.reply(200, json.dumps(tool_call_response("compile_and_test", step, n)))
        elif step[0] == "status":
            self.reply(step[1], '{"error": "scripted failure"}')
        elif step[0] == "malformed":
            self.reply(200, '{"choices": [{"message": ')
        elif step[0] == "tool":
            self.reply(200, json.dumps(tool_call_response(step[1], "ls /", n)))
        elif step[0] == "sleep":
            time.sleep(step[1])
            self.reply(200, json.dumps(tool_call_response("compile_and_test", CORRECT, n)))

    def reply(self, status, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


def start_for(cls, checker, prefix):
    """setUpClass of a test class that talks to the stub: skips without the
    op-stage checker, else gives it cls.work (a temp folder), cls.server,
    cls.url and cls.requests. stop_for(cls) is its tearDownClass."""
    import os
    import tempfile
    import unittest
    if not checker or not os.path.exists(checker):
        raise unittest.SkipTest("no adapt-candidate-check (runtime not built)")
    cls.work = tempfile.mkdtemp(prefix=prefix)
    cls.server = Running(os.path.join(cls.work, "requests.jsonl"))
    cls.requests, cls.url = cls.server.requests, cls.server.url


def stop_for(cls):
    import shutil
    cls.server.stop()
    shutil.rmtree(cls.work, ignore_errors=True)


class Running:
    """The server in a child process for a test class: `url` for --endpoint,
    `requests` the log of what the loop sent; stop() ends it."""

    def __init__(self, requests_log):
        import subprocess
        self.requests = requests_log
        self.process = subprocess.Popen([sys.executable, __file__, "0", requests_log],
                                        stdout=subprocess.PIPE, text=True)
        self.url = "http://127.0.0.1:%s/v1" % self.process.stdout.readline().strip()

    def stop(self):
        self.process.terminate()
        self.process.wait()


def main():
    Handler.log_path = sys.argv[2]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
