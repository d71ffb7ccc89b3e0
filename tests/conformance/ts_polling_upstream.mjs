// A TypeScript SDK server with an event store whose tool closes its SSE stream on purpose
// (SEP-1699 polling) CLOSES times before it answers, waiting GAP_MS after each close: a
// resumable upstream the gateway must resume again and again. The tool's answer may come while
// no GET is open (GAP_MS longer than the retry): the replay then holds it, and the SDK keeps
// that replay open.
//
// Usage: node ts_polling_upstream.mjs PORT CLOSES GAP_MS; prints "listening" when ready.
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';

const [port, closes, gapMs] = process.argv.slice(2).map(Number);
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function mcpServer() {
  const server = new McpServer({ name: 'polling-upstream', version: '1.0.0' }, { capabilities: { logging: {} } });
  server.tool('close_and_answer', 'closes its stream, then answers', {}, async (_args, extra) => {
    for (let round = 0; round < closes; round++) {
      await extra.sendNotification({
        method: 'notifications/message',
        params: { level: 'info', data: { round } },
      });
      await pause(50);
      extra.closeSSEStream?.();
      await pause(gapMs);
    }
    return { content: [{ type: 'text', text: `answered after ${closes} closes` }] };
  });
  return server;
}

const app = createMcpExpressApp();
const eventStore = new InMemoryEventStore();
const transports = new Map();
app.all('/mcp', async (req, res) => {
  const sessionId = req.headers['mcp-session-id'];
  if (sessionId && transports.has(sessionId)) {
    await transports.get(sessionId).handleRequest(req, res, req.body);
    return;
  }
  if (sessionId || !isInitializeRequest(req.body)) {
    res.status(404).json({ jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null });
    return;
  }
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    eventStore,
    retryInterval: 100,
    onsessioninitialized: (id) => transports.set(id, transport),
  });
  await mcpServer().connect(transport);
  await transport.handleRequest(req, res, req.body);
});
app.listen(port, '127.0.0.1', () => console.log('listening'));
