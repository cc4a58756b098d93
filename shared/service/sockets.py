"""Listening sockets for the HTTP services, bound up front so their URL is known before serving."""

from __future__ import annotations

import errno
import socket

from rollout.shared.errors import RolloutError


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one), or a clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this: a response's head and body are separate writes, and
    # Nagle plus delayed ACKs would hold the body back ~40 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        # An unknown or foreign address is the host's fault, anything else the port's.
        unknown = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
        hint = (
            "give --host an address of this machine (127.0.0.1, 0.0.0.0, ::1, ...)"
            if unknown
            else "pick another port with --port, or stop what holds this one"
        )
        raise RolloutError(
            f"cannot listen on {host}:{port}: {exc.strerror}", problems=[hint]
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    """The http URL a bound socket answers on."""
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"
