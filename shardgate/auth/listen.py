"""Where a server may listen without TLS or authentication.

The rule (issue 16): no authentication only on a loopback address and only
when asked for (``shardgate up`` asks; ``shardgate gate`` / ``shardgate
tablet`` need ``--no-auth``); a non-loopback address needs TLS *and*
authentication, unless forced with ``--insecure-bind-anyway``, which prints a
warning on every start.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from shardgate.errors import FailedPrecondition

log = logging.getLogger(__name__)

INSECURE_FLAG = "--insecure-bind-anyway"


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback address."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos
    )


def check_listen(
    host: str, *, tls: bool, auth: bool, no_auth: bool, insecure: bool, what: str = "server"
) -> None:
    """Refuse (FailedPrecondition) a listen address the rule above forbids.

    ``auth``: a users file or required client certificates are configured;
    ``no_auth``: the operator asked for no authentication.
    """
    if not auth and not no_auth:
        raise FailedPrecondition(
            f"the {what} has no authentication configured: pass --users-file FILE or "
            "--tls-ca (client certificates), or --no-auth to serve without it on loopback"
        )
    if is_loopback(host):
        return
    if tls and auth:
        return
    missing = " and ".join(m for m, ok in (("TLS", tls), ("authentication", auth)) if not ok)
    if insecure:
        log.warning("INSECURE: the %s listens on %s without %s (%s)", what, host, missing,
                    INSECURE_FLAG)
        return
    raise FailedPrecondition(
        f"refusing to listen on {host} (not loopback) without {missing}: pass "
        f"--tls-cert/--tls-key and --users-file or --tls-ca, or listen on 127.0.0.1 "
        f"({INSECURE_FLAG} forces it, for networks you trust)"
    )
