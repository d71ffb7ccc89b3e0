"""The bundled example MCP server: official ``mcp`` SDK (2.x), Streamable HTTP, no event store.

It is the upstream of the project's integration tests, of the MCP conformance suite (run bare
and through the gateway) and of ``mcp-sse-gateway demo``. Run it with
``python -m mcp_sse_gateway.example --host 127.0.0.1 --port 0 --path /mcp``: once listening it
prints one line on stdout, ``LISTENING http://127.0.0.1:<port>/mcp``. It needs the ``example``
extra (``pip install 'mcp-sse-gateway[example]'``).

Why no event store
------------------
The SDK can make its own streams resumable when it is given an ``EventStore``. This server is
deliberately built without one, like most MCP servers in the wild: it never sends event ids,
priming events or ``retry`` fields, never closes a stream on purpose, and answers a ``GET`` with
``Last-Event-ID`` like a plain ``GET``. A dropped connection loses whatever the server sent
afterwards. Resumability is what the gateway adds in front of it, so every resumability
property the tests observe through the gateway is the gateway's, not the SDK's.

Surface
-------
Tools of the conformance suite (``@modelcontextprotocol/conformance`` 0.1.16, 0.2.0-alpha.12):
``test_simple_text``, ``test_image_content``, ``test_audio_content``,
``test_embedded_resource``, ``test_multiple_content_types``, ``test_tool_with_logging``,
``test_logging_tool``, ``test_tool_with_progress``, ``test_error_handling``,
``test_sampling(prompt)``, ``test_elicitation(message)``,
``test_elicitation_sep1034_defaults``, ``test_elicitation_sep1330_enums``,
``test_streaming_elicitation``, ``test_reconnection`` (SSE polling), ``test_missing_capability``,
``test_x_mcp_header(region)``, ``test_trigger_tool_change``, ``test_trigger_prompt_change``,
``json_schema_2020_12_tool`` and the SEP-2322 multi-round-trip tools
``test_input_required_result_{elicitation, sampling, list_roots, request_state,
multiple_inputs, multi_round, tampered_state, capabilities}``.

Tools for testing a proxy (:mod:`.gateway_tools`):

- ``stream_notifications(count, interval_ms=0, payload_bytes=0, standalone=False)``: ``count``
  numbered notifications (``notifications/message`` with ``data.index`` 0..count-1 when
  logging is allowed, ``notifications/progress`` with ``progress`` = index when a
  progressToken was given), then ``sent <count> notifications``;
- ``big_payload(size_bytes, multiline=True, unicode=True, seed=0)``: exactly ``size_bytes``
  bytes of deterministic UTF-8 text (multi-byte characters, CR/LF/CRLF), its SHA-256 in
  ``structuredContent`` and in a second content item;
- ``sleep(seconds)``;
- ``update_watched_resource(text)``: ``notifications/resources/updated`` to subscribed
  sessions, on their standalone GET stream.

For server-to-client requests, tests use ``test_elicitation`` (elicitation: accept with
``username`` and ``email``) and ``test_sampling`` (sampling: any text answer).

Resources: ``test://static-text`` (text/plain), ``test://static-binary`` (image/png),
``test://watched-resource`` (subscribable); template ``test://template/{id}/data``
(application/json). Prompts: ``test_simple_prompt``, ``test_prompt_with_arguments(arg1, arg2)``,
``test_prompt_with_embedded_resource(resourceUri)``, ``test_prompt_with_image``,
``test_input_required_result_prompt``. Also ``completion/complete`` (prefix matches for
``arg1``, ``arg2`` and ``id``), ``logging/setLevel`` (per session), ``resources/subscribe`` and
``resources/unsubscribe``, ``ping``.

Extensions: Skills (SEP-2640, ``io.modelcontextprotocol/skills`` with ``directoryRead``;
:mod:`.skills`): ``skills/list``, ``skills/get``, ``resources/directory/read`` and one skill,
``skill://mcp-sse-gateway/resumable-streams/SKILL.md``. Not Tasks (SEP-2663,
``io.modelcontextprotocol/tasks``): the SDK does not implement it, so the suite's ``tasks-*``
scenarios fail against this server, bare and through the gateway alike.

Protocol eras: sessions (``Mcp-Session-Id``) for 2025-03-26 … 2025-11-25 clients by default
(``--stateless`` for none, ``--json-response`` for JSON instead of SSE answers), and the
sessionless 2026-07-28 protocol on the same endpoint (the SDK routes on
``MCP-Protocol-Version``), where client input travels in ``InputRequiredResult`` round trips.

DNS-rebinding protection (SDK transport security): accepted ``Host`` values are
``127.0.0.1``, ``localhost``, ``[::1]`` and the listen address, each with any port or none,
plus ``--allow-host``; accepted ``Origin`` values are the same names over http/https, plus
``--allow-origin``, or none. Anything else is refused (421 for Host, 403 for Origin). The
gateway forwards requests with the upstream's own ``Host`` (``127.0.0.1:<port>``), so it passes.
"""

from mcp_sse_gateway.example.upstream import build_app, build_server, main, serve

__all__ = ["build_app", "build_server", "main", "serve"]
