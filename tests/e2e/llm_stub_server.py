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

HANG = HEADER + r"""
torch::Tensor adapt_candidate(const std::vector<torch::Tensor> &inputs,
                              const std::map<std::string, double> &params) {
  volatile bool forever = true;
  while (forever) {
  }
  return inputs[0];
}
"""

SCENARIOS = {
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


def main():
    Handler.log_path = sys.argv[2]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
