// A Node gRPC client (@grpc/grpc-js with @grpc/grpc-js-xds) resolving xds:/// targets through
// the Sentinel agent, for tests/integration/test_agent_xds_node.py. Its bootstrap comes from
// GRPC_XDS_BOOTSTRAP_CONFIG, as the agent prints it. It reads one JSON request a line on stdin
// and answers each with one JSON line on stdout:
//   {"op": "calls", "target": "xds:///svc", "n": 20, "partition": "p1" | null, "deadline": 5}
//     -> {"counts": {"a": 12, "b": 8}}            which instance answered each call, in turn
//     -> {"error": {"code": 14, "name": "UNAVAILABLE", "details": "..."}}   the first failure
//   {"op": "close", "target": "xds:///svc"}       -> {"closed": true}
// The calls go to sentinel.testing.grpcserver's unary Who method (bytes in, the instance's
// name out), so no protocol definition is needed.
"use strict";

const grpc = require("@grpc/grpc-js");
const xds = require("@grpc/grpc-js-xds");
const readline = require("node:readline");

xds.register();

const WHO = "/sentinel.testing.Who/Who";
const PARTITION_HEADER = "x-sentinel-partition";
const identity = (buffer) => buffer;
const clients = new Map();

function client(target) {
  if (!clients.has(target)) {
    clients.set(target, new grpc.Client(target, grpc.credentials.createInsecure()));
  }
  return clients.get(target);
}

function call(target, partition, seconds) {
  const metadata = new grpc.Metadata();
  if (partition !== null && partition !== undefined) {
    metadata.set(PARTITION_HEADER, partition);
  }
  return new Promise((resolve, reject) => {
    client(target).makeUnaryRequest(
      WHO,
      identity,
      identity,
      Buffer.alloc(0),
      metadata,
      { deadline: Date.now() + seconds * 1000 },
      (error, answer) => (error ? reject(error) : resolve(answer.toString())),
    );
  });
}

async function answer(request) {
  if (request.op === "close") {
    clients.get(request.target)?.close();
    clients.delete(request.target);
    return { closed: true };
  }
  const counts = {};
  try {
    for (let i = 0; i < request.n; i++) {
      const who = await call(request.target, request.partition, request.deadline ?? 5);
      counts[who] = (counts[who] || 0) + 1;
    }
  } catch (error) {
    return {
      error: { code: error.code, name: grpc.status[error.code], details: error.details },
      counts,
    };
  }
  return { counts };
}

// One request at a time, in order: the test waits for each answer before it sends the next.
let queue = Promise.resolve();
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  queue = queue.then(async () => {
    process.stdout.write(JSON.stringify(await answer(JSON.parse(line))) + "\n");
  });
});
process.stdin.on("end", () => queue.then(() => process.exit(0)));
