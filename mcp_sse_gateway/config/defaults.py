"""Every default of the settings, each a named constant with the reason it was chosen (DESIGN D7).

Units are in the names: ``*_s`` seconds, ``*_ms`` milliseconds, ``*_bytes`` bytes. ``MIN_*``
constants are the lower bounds the sections enforce.
"""

MIB = 1024 * 1024

#: SEP-1699 suggests a short reconnection delay; 1 s keeps polling cheap without hammering.
DEFAULT_RETRY_MS = 1000
#: Below the 30-60 s idle timeouts of common load balancers (AWS ALB 60 s, nginx 60 s).
DEFAULT_KEEPALIVE_S = 15.0
#: Bounds one stream's history; a tool call rarely emits more notifications than this.
DEFAULT_MAX_EVENTS_PER_STREAM = 10_000
#: Long enough for a client to come back after a deploy or a network blip.
DEFAULT_FINISHED_STREAM_TTL_S = 300.0
#: Matches the idle session lifetime of the official SDKs' session managers.
DEFAULT_SESSION_IDLE_TTL_S = 3600.0
DEFAULT_MAX_STREAMS_PER_SESSION = 100
#: Tool results carrying files or images reach several MB; 16 MiB leaves headroom.
DEFAULT_MAX_EVENT_BYTES = 16 * MIB
DEFAULT_MAX_BODY_BYTES = 16 * MIB
DEFAULT_MEMORY_STORE_MAX_BYTES = 256 * MIB
DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_HEARTBEAT_EXPIRY_S = 15.0
#: A session's standalone lease (one upstream GET across replicas) lives this long unrenewed;
#: its holder renews it every third of it.
DEFAULT_LEASE_TTL_S = 10.0
MIN_LEASE_TTL_S = 0.3
#: Kubernetes' default terminationGracePeriodSeconds is 30 s; operators raise both together.
DEFAULT_DRAIN_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Bounds only the wait for response headers: a tool call that answers as JSON may run long.
DEFAULT_HEADERS_TIMEOUT_S = 300.0
DEFAULT_REPLAY_BATCH_EVENTS = 1000
DEFAULT_REPLAY_MAX_PASSES = 16
#: Redis store: see ``StoreSettings.stall_timeout_s`` (DESIGN D7, slow is not down).
DEFAULT_STALL_TIMEOUT_S = 5.0
#: Below this, a loaded but healthy Redis would pass for a stalled one, seconds.
MIN_STALL_TIMEOUT_S = 0.1
#: Redis store: see ``StoreSettings.max_queued_calls``.
DEFAULT_MAX_QUEUED_CALLS = 10_000
DEFAULT_SLOW_READER_CUT_S = 10.0
#: How long an upgraded JSON POST waits for the upstream's status before the client gets its
#: 200 SSE stream: long enough for an authorization layer's 401/403 (a token check, even one
#: that asks an identity provider) to be relayed as it is, so the client's OAuth flow starts;
#: far below any idle timeout (60 s and up), so the keepalives that follow still arrive in time.
DEFAULT_UPGRADE_WAIT_MS = 2000
#: An upgraded call's response headers come with its answer, when the tool is done: the wait
#: for them is the call's whole run (an hour), not ``upstream.headers_timeout_s``.
DEFAULT_UPGRADE_ANSWER_TIMEOUT_S = 3600.0
#: Tasks (DESIGN D11): a record is kept an hour after creation, long enough to poll for the
#: result of a long call and come back after a restart; short enough to bound the store.
DEFAULT_TASK_TTL_MS = 3_600_000
#: Clients poll about once a second: a finished call is seen within a second, at one small
#: read per client per second.
DEFAULT_TASK_POLL_INTERVAL_MS = 1000
#: An MRTR input request comes at once (before the tool works); a second covers a loaded host.
DEFAULT_TASK_INPUT_WAIT_MS = 1000
#: One upstream round of a task: half an hour, well inside the record's TTL (an hour), so the
#: result of a round that runs to the bound is still kept half an hour for the client to poll.
DEFAULT_TASK_RUN_TIMEOUT_S = 1800.0
#: Names a browser on this machine can reach the gateway by; anything else is DNS rebinding.
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "[::1]")
DEFAULT_ALLOWED_ORIGINS = (
    "http://localhost",
    "http://127.0.0.1",
    "http://[::1]",
    "https://localhost",
    "https://127.0.0.1",
    "https://[::1]",
)

#: How long credentials the upstream accepted are taken as still accepted without asking it
#: again: a revoked token keeps reading its own session's stored events at most this long.
DEFAULT_AUTH_RECHECK_S = 60.0
#: An authorization probe is one JSON-RPC ping; a healthy upstream answers in milliseconds.
DEFAULT_AUTH_PROBE_TIMEOUT_S = 5.0
#: Shortest ``auth.digest_key`` accepted, characters (HMAC-SHA256 keys below 128 bits are weak).
MIN_DIGEST_KEY_CHARS = 16

#: Generous for any real client (a request's headers arrive in one packet), short enough that
#: connections trickling headers (slowloris) do not pile up.
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Bodies are at most 16 MiB; 30 s covers them at about 4 Mbit/s.
DEFAULT_BODY_TIMEOUT_S = 30.0
#: Above the common load balancers' idle timeouts (AWS ALB 60 s): the balancer, not the
#: gateway, closes an idle pooled connection, so it never sends on one the gateway just closed.
DEFAULT_KEEPALIVE_TIMEOUT_S = 75.0
#: aiohttp's own limits, made configurable.
DEFAULT_MAX_HEADERS = 128
DEFAULT_MAX_HEADER_BYTES = 8190
#: Each open stream costs a few tens of KiB; 10,000 stays within a container's memory.
DEFAULT_MAX_CONCURRENT_REQUESTS = 10_000
DEFAULT_MAX_PUMPS = 10_000
#: Enough to keep both cores busy opening streams, few enough that one event-loop turn stays
#: short while thousands wait (bench: scale).
DEFAULT_MAX_OPENING_STREAMS = 16
#: Request handlers started per event-loop turn (``server.max_requests_per_turn``): a burst of
#: 5,000 calls is started over about 300 short turns (bench: scale; 64 did no better).
DEFAULT_MAX_REQUESTS_PER_TURN = 16
#: 700 by default in Python: at thousands of streams, young collections promote every waiting
#: stream's objects, and the full collections that follow pause the loop for 0.3 s each
#: (docs/decisions.md, "Cost at scale").
DEFAULT_GC_YOUNG_THRESHOLD = 20_000
#: Sixteen bodies of the largest size at once; tool calls' bodies are small.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 256 * MIB
