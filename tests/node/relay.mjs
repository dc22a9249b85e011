// An MCP client of the TypeScript SDK (the one inside most desktop and IDE agents), relaying
// tool calls for tests/test_mcp_clients.py: it connects to the URL with the token, lists the
// tools as every client does first (the SDK then checks each result against the tool's output
// schema), then reads one call a line on stdin, {"tool": ..., "arguments": {...}}, and writes
// one answer a line on stdout: {"result": <CallToolResult>}, or {"error": {code, message}} when
// the SDK itself refused the answer (a protocol error, which the model never sees).
//
//     node relay.mjs http://127.0.0.1:8000/mcp sbt_...
import readline from "node:readline";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token] = process.argv.slice(2);
const write = (answer) => process.stdout.write(`${JSON.stringify(answer)}\n`);

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "switchboard-todos-tests", version: "1.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
write({ tools: tools.map((tool) => tool.name) });

for await (const line of readline.createInterface({ input: process.stdin })) {
  const { tool, arguments: args } = JSON.parse(line);
  try {
    write({ result: await client.callTool({ name: tool, arguments: args }) });
  } catch (error) {
    write({ error: { code: error.code ?? null, message: String(error.message ?? error) } });
  }
}
await transport.terminateSession();
await client.close();
