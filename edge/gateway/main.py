"""``edge gateway``: parse, check, listen, report READY, serve until SIGTERM.

The listener is aiohttp's request handler behind a protocol factory of our own, which holds the
connection count to ``--max-connections`` (a connection over it gets a 503 and is closed
before anything is read) and a watchdog that closes connections with no request in progress
for ``--idle-timeout`` (idle keep-alive, or headers that never finish: slowloris).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

from edge.config.command_line import UsageError, fail
from edge.gateway.options import check_exposure, gateway_parser, parse_listen, read_api_key

__all__ = ["main", "run_gateway"]

_REFUSED = (b'{"error":{"message":"too many connections to the gateway","type":"service_unavailable",'
            b'"param":null,"code":"too_many_connections"},"error_type":"Overloaded"}')
_REFUSED_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(_REFUSED)).encode() + b"\r\n\r\n" + _REFUSED)


class _Refuse(asyncio.Protocol):
    """A connection over the cap: one 503, then closed; nothing of the request is read."""

    def connection_made(self, transport) -> None:
        transport.write(_REFUSED_RESPONSE)
        transport.close()


def _address(args) -> str:
    from edge.config.env import env_address
    from edge.ipc.endpoint import AddressError, default_address, normalize_address

    given = args.connect or env_address()
    if not given:
        return default_address()
    try:
        return normalize_address(given)
    except AddressError as exc:
        raise UsageError(f"--connect: {exc}") from None


def _ssl_context(args):
    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--tls-cert/--tls-key: {exc}") from None
    return ctx


async def _watch(server, gw, idle_s: float, stop: asyncio.Event) -> None:
    tick = min(0.5, idle_s / 4)
    while not stop.is_set():
        now = time.monotonic()
        live = set(server.connections)
        for h in list(gw.conns):
            if h not in live:
                del gw.conns[h]
        for h in live:
            state = gw.conns.setdefault(h, [0, now])
            if state[0] == 0 and now - state[1] > idle_s and h.transport is not None:
                gw.metrics.closed_idle += 1
                h.transport.abort()
        try:
            await asyncio.wait_for(stop.wait(), tick)
        except asyncio.TimeoutError:
            pass


async def _serve(args, listen, address, curve, api_key, ssl_ctx) -> int:
    from aiohttp import web

    from edge.gateway.app import Gateway
    from edge.gateway.metrics import GatewayMetrics
    from edge.ipc.aio import AsyncEdgePool
    from edge.system.log import log
    from edge.system.notify import notify

    loop = asyncio.get_running_loop()
    pool = AsyncEdgePool(address, args.pool_size, curve=curve)
    pool.start()
    gw = Gateway(args, pool, GatewayMetrics(), api_key)
    runner = web.AppRunner(gw.app(), handle_signals=False, access_log=None, keepalive_timeout=args.idle_timeout,
                           lingering_time=1.0, shutdown_timeout=5.0)
    await runner.setup()
    server = runner.server
    if server is None:  # aiohttp makes it in setup(); None would refuse every connection below
        raise RuntimeError("aiohttp's AppRunner has no server after setup()")
    gw.server = server

    def factory():
        if len(server.connections) >= args.max_connections:
            gw.metrics.refused_connections += 1
            return _Refuse()
        return server()

    try:
        # A TLS handshake is bounded like idle headers: asyncio's default (60 s) would let connections that
        # never send a ClientHello hold file descriptors past --max-connections, which counts only the
        # connections aiohttp has (after the handshake).
        tls_bound = {"ssl_handshake_timeout": args.idle_timeout} if ssl_ctx is not None else {}
        srv = await loop.create_server(factory, listen.host, listen.port, ssl=ssl_ctx, backlog=256,
                                       reuse_address=True, **tls_bound)
    except OSError as exc:
        await runner.cleanup()
        pool.close()
        return fail("edge gateway", f"cannot listen on {listen.host}:{listen.port}: {exc.strerror or exc}", 3)
    port = srv.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = loop.create_task(_watch(server, gw, args.idle_timeout, stop))
    scheme = "https" if ssl_ctx else "http"
    log("gateway.ready", listen=f"{scheme}://{listen.host}:{port}", runtime=address, pool=args.pool_size,
        auth=api_key is not None, tls=ssl_ctx is not None)
    notify("READY=1", f"STATUS=listening on {scheme}://{listen.host}:{port}, runtime {address}")
    await stop.wait()
    notify("STOPPING=1")
    srv.close()
    await watcher
    await runner.cleanup()  # waits for the requests in progress (shutdown_timeout at most)
    pool.close()
    log("gateway.stopped")
    return 0


def run_gateway(argv: list[str]) -> int:
    args = gateway_parser().parse_args(argv)
    try:
        listen = parse_listen(args.listen)
        ssl_ctx = _ssl_context(args)
        check_exposure(listen, args.api_key_file, ssl_ctx is not None)
        api_key = read_api_key(args.api_key_file) if args.api_key_file else None
        address = _address(args)
        from edge.ipc.curve import KeyFileError, client_curve

        try:
            curve = client_curve(address, args.server_key, args.client_key)
        except KeyFileError as exc:
            raise UsageError(str(exc)) from None
    except UsageError as exc:
        return fail("edge gateway", str(exc), exc.exit_code)
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return fail("edge gateway", "aiohttp is not installed: pip install 'edge[gateway]'", 2)
    from edge.system.log import configure

    configure(args.log_level)
    return asyncio.run(_serve(args, listen, address, curve, api_key, ssl_ctx))


def main() -> None:
    sys.exit(run_gateway(sys.argv[1:]))


if __name__ == "__main__":
    main()
