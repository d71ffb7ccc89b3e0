"""``python -m mcp_sse_gateway.example``: serve the example MCP server over Streamable HTTP.

Prints exactly one line on stdout once listening, ``LISTENING http://HOST:PORT/PATH``, so tests
and scripts can start it on port 0 and read its URL; logs go to stderr. SIGTERM and SIGINT stop
it. ``--help`` lists the options.
"""

import sys

from mcp_sse_gateway.example.upstream import main

sys.exit(main())
