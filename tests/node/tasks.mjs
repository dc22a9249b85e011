// The TypeScript SDK's client using MCP Tasks (client.experimental.tasks), for
// tests/test_mcp_clients.py: it connects to the URL with the token, lists the tools (the SDK then
// knows which run as tasks and their output schemas), then reads one request a line on stdin
// and writes what the SDK made of it, one JSON line each:
//
//   {"op": "stream", "tool": ..., "arguments": {...}, "ttl": ms} -> callToolStream: one line per
//       message ({"type": "taskCreated" | "taskStatus" | "result" | "error", ...}), then {"end": true}
//   {"op": "get" | "result" | "cancel", "taskId": ...}, {"op": "list", "cursor": ...}
//       -> {"answer": ...} or {"error": {code, message}}
//   {"op": "notified", "taskId": ...} -> {"answer": the params of the first
//       notifications/tasks/status of the task}, once it came (on the standalone stream)
//
//     node tasks.mjs http://127.0.0.1:8000/mcp sbt_...
import readline from "node:readline";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  CallToolResultSchema,
  TaskStatusNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const [url, token] = process.argv.slice(2);
const write = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);
const failure = (error) => ({ code: error.code ?? null, message: String(error.message ?? error) });

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "switchboard-todos-tests", version: "1.0.0" });
const statuses = new Map(); // taskId -> the first status notified, or the resolvers waiting for it
client.setNotificationHandler(TaskStatusNotificationSchema, ({ params }) => {
  const waiting = statuses.get(params.taskId);
  statuses.set(params.taskId, { params });
  for (const resolve of Array.isArray(waiting) ? waiting : []) resolve(params);
});
const notified = (taskId) => {
  const known = statuses.get(taskId);
  if (known && !Array.isArray(known)) return Promise.resolve(known.params);
  return new Promise((resolve) => statuses.set(taskId, [...(known ?? []), resolve]));
};
await client.connect(transport);
const { tools } = await client.listTools();
write({
  tools: tools.map((tool) => tool.name),
  taskTools: tools.filter((tool) => tool.execution?.taskSupport).map((tool) => tool.name),
  capabilities: client.getServerCapabilities(),
});

const tasks = client.experimental.tasks;
const requests = {
  get: ({ taskId }) => tasks.getTask(taskId),
  result: ({ taskId }) => tasks.getTaskResult(taskId, CallToolResultSchema),
  cancel: ({ taskId }) => tasks.cancelTask(taskId),
  list: ({ cursor }) => tasks.listTasks(cursor),
  notified: ({ taskId }) => notified(taskId),
};

for await (const line of readline.createInterface({ input: process.stdin })) {
  const request = JSON.parse(line);
  if (request.op === "stream") {
    const params = { name: request.tool, arguments: request.arguments };
    const options = { task: request.ttl === undefined ? {} : { ttl: request.ttl } };
    for await (const message of tasks.callToolStream(params, CallToolResultSchema, options)) {
      write(message.type === "error" ? { type: "error", error: failure(message.error) } : message);
    }
    write({ end: true });
    continue;
  }
  try {
    write({ answer: await requests[request.op](request) });
  } catch (error) {
    write({ error: failure(error) });
  }
}
await transport.terminateSession();
await client.close();
