"""Who is at the other end of a loopback connection, as far as the failed-auth limiter needs.

An agent with `network: "open"` shares the host's network, so its requests come from 127.0.0.1 as
a trainer's on the same host do. Every sandbox runs in a mount namespace of its own (bubblewrap
always makes one), so the mount namespace of the process that holds the client socket tells the
two apart: the limiter keys a peer in another mount namespace apart from the address, and an
agent's wrong tokens slow only that agent, never the trainer.

Read from /proc: the socket's inode from /proc/net/tcp{,6} (the connection's two ends), then the
process holding it. Linux only; anywhere it cannot be read, the key is the address alone.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

from harness_env.core.capture.asgi import Scope
from harness_env.core.sandbox.envvars import MARKER_VAR


def _proc_hex(host: str, port: int) -> tuple[str, str] | None:
    """("ADDR:PORT" as /proc/net/tcp prints it, which table) for one end of a connection."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 4:
        text = f"{int.from_bytes(socket.inet_aton(str(ip)), sys.byteorder):08X}"
        return f"{text}:{port:04X}", "/proc/net/tcp"
    packed = ip.packed  # each 32-bit word printed in the machine's byte order
    text = "".join(f"{int.from_bytes(packed[i : i + 4], sys.byteorder):08X}" for i in range(0, 16, 4))
    return f"{text}:{port:04X}", "/proc/net/tcp6"


def _socket_inode(client: tuple[str, int], server: tuple[str, int]) -> str | None:
    """The inode of the peer's socket: the row whose local end is the client and remote the server."""
    ours, theirs = _proc_hex(*client), _proc_hex(*server)
    if ours is None or theirs is None or ours[1] != theirs[1]:
        return None
    try:
        with open(ours[1]) as table:
            for row in table:
                fields = row.split()
                if len(fields) > 9 and fields[1] == ours[0] and fields[2] == theirs[0]:
                    return fields[9]
    except OSError:
        return None
    return None


def _holder(inode: str) -> int | None:
    """The pid of a process holding the socket (any of them: they share the mount namespace
    unless a sandbox passed it out, which it cannot: it reaches no process outside)."""
    target = f"socket:[{inode}]"
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                if os.readlink(fd.path) == target:
                    return int(entry.name)
        except OSError:  # gone, or not ours to read
            continue
    return None


def _mount_namespace(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return None


def _sandbox_marker(pid: int) -> str | None:
    """The rollout's sandbox id from the process's environment (every sandboxed command starts
    with it): a namespace's inode is reused once the namespace is gone, a sandbox id never."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read(1 << 20)
    except OSError:
        return None
    prefix = MARKER_VAR.encode() + b"="
    value = next((item[len(prefix) :] for item in env.split(b"\0") if item.startswith(prefix)), b"")
    return value[:128].decode("ascii", "replace") if value else None


def peer_key(scope: Scope, address: str) -> str:
    """The limiter's key for this connection: the address, with the peer's mount namespace when the
    peer is a local process in one other than the server's (a sandbox). Blocking (reads /proc):
    call it off the event loop."""
    client, server = scope.get("client"), scope.get("server")
    if not client or not server or client[0] != address:  # rewritten from X-Forwarded-For: not a local peer
        return address
    try:
        if not ipaddress.ip_address(address).is_loopback:
            return address
    except ValueError:
        return address
    try:
        inode = _socket_inode((str(client[0]), int(client[1])), (str(server[0]), int(server[1])))
    except (TypeError, ValueError):  # a transport without ports (an in-process test client)
        return address
    pid = _holder(inode) if inode and inode != "0" else None
    theirs = _mount_namespace(pid) if pid is not None else None
    if pid is None or theirs is None or theirs == _mount_namespace("self"):
        return address
    # A process that dropped the marker is still apart from the host, by its namespace.
    marker = _sandbox_marker(pid)
    return f"{address}|sandbox:{marker}" if marker else f"{address}|mnt:{theirs}"


def is_local_address(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
