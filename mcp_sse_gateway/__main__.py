"""``python -m mcp_sse_gateway``: the same as the ``mcp-sse-gateway`` command."""

import sys

from mcp_sse_gateway.cli import main

sys.exit(main())
