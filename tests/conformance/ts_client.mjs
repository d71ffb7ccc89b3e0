// Calls one tool through the official TypeScript SDK client (Streamable HTTP) and prints, as one
// JSON line on stdout, every notification received and the tool's result. The SDK's own
// reconnection (Last-Event-ID, retry) is what gets the call through closed or dropped streams.
//
// usage: node ts_client.mjs URL TOOL ARGS_JSON
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, tool, argsJson] = process.argv.slice(2);
const notifications = [];
const errors = [];
const client = new Client({ name: "mcp-sse-gateway-ts-test", version: "1.0.0" });
client.fallbackNotificationHandler = async (notification) => {
  notifications.push(notification);
};
const transport = new StreamableHTTPClientTransport(new URL(url), {
  reconnectionOptions: {
    initialReconnectionDelay: 100,
    maxReconnectionDelay: 1000,
    reconnectionDelayGrowFactor: 1.5,
    maxRetries: 5,
  },
});
transport.onerror = (error) => errors.push(String(error));
await client.connect(transport);
const result = await client.callTool(
  { name: tool, arguments: JSON.parse(argsJson) },
  undefined,
  { timeout: 60000, resetTimeoutOnProgress: true },
);
await transport.terminateSession().catch(() => {});
await client.close();
process.stdout.write(
  JSON.stringify({ protocolVersion: transport.protocolVersion, notifications, result, errors }) + "\n",
);
