"""The HTTP gateway (``edge gateway``): OpenAI's and Hugging Face TEI's embeddings APIs in front
of the runtime's ZeroMQ socket, in a process of its own (docs/gateway.md).

A client of the runtime like any app: the runtime's boot path never imports this package or
its HTTP stack (aiohttp). Modules: ``options`` (the command line, stdlib only), ``main`` (the
listener, connection limits, READY), ``app`` (the routes), ``errors`` (codes to statuses and
each API's error body), ``metrics`` (its Prometheus text).
"""
