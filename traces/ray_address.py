"""How rlfleet joins Ray, shared by the planner's sweeps and the runtime: the address forms it takes
and the switch that keeps a Ray started here on loopback."""

from __future__ import annotations

import re
import socket

from traces.errors import SpecError

# "0": Ray takes 127.0.0.1 as the node address. Ray reads it when it is first imported
# (ray._private.ray_constants), so it is set before that import; without it Ray picks this host's
# external address, unreachable on some machines.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PROBE_SECONDS = 5.0  # a Ray address must answer this fast: ray.init retries a dead one for minutes

# The forms ray.init(address=...) documents: "auto" (the cluster `ray start` made on this machine),
# "local" (a new one), the head's GCS "host:port", or Ray Client's "ray://host:port".
_HOST = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.\-_]{0,252}))"
_ADDRESS = re.compile(rf"^(ray://)?{_HOST}:(\d{{1,5}})$")


def check_ray_address(text: str) -> str:
    """`text` if Ray can take it as an address; else SpecError naming the forms it takes."""
    text = text.strip()
    if text in ("auto", "local"):
        return text
    match = _ADDRESS.match(text)
    if match is not None and 1 <= int(match.group(4)) <= 65535:
        return text
    raise SpecError(f"ray address {text!r}: give the head's host:port (e.g. 127.0.0.1:6379), ray://host:10001 "
                    "(Ray Client), auto (the cluster `ray start` made here) or local (a new one on this machine)")


def host_port(address: str) -> tuple[str, int] | None:
    """The host and port an address names (None for auto and local), after check_ray_address."""
    text = check_ray_address(address)
    if text in ("auto", "local"):
        return None
    match = _ADDRESS.match(text)
    assert match is not None  # check_ray_address matched it
    return match.group(2).strip("[]"), int(match.group(4))


def probe_ray_address(address: str, instead: str) -> None:
    """SpecError (one line, ending in `instead`) unless something listens at the address's host:port:
    a TCP connect in seconds, before ray.init spends minutes retrying a dead head."""
    where = host_port(address)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=PROBE_SECONDS).close()
    except OSError as exc:
        raise SpecError(f"nothing answers at Ray address {address} ({exc.strerror or type(exc).__name__}); "
                        f"start the head with `ray start --head` and pass its address, or {instead}") from None
