"""``clover-agent serve``: Clover behind an OpenAI-compatible HTTP server, many requests decoded
together by :class:`clover_agent.engine.batching.BatchEngine`.

One concept per module: :mod:`~clover_agent.serve.errors` (OpenAI's error shape),
:mod:`~clover_agent.serve.request` (a chat-completions body read and checked),
:mod:`~clover_agent.serve.answer` (engine output into OpenAI's message, deltas and usage),
:mod:`~clover_agent.serve.metrics` (Prometheus text), :mod:`~clover_agent.serve.sizing` (how many
requests at once), :mod:`~clover_agent.serve.app` (the routes) and :mod:`~clover_agent.serve.server`
(uvicorn, the API key rule, the drain on SIGTERM). Endpoints and fields: docs/backends.md,
"clover-agent serve".
"""
