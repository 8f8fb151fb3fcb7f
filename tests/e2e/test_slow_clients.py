"""Slow and hostile clients against a real ``kiln up`` (SmolLM2), with raw sockets: a stream
reader that stops reading, a connection that sends nothing, headers and bodies that trickle,
oversized headers, and more connections from one address than it may hold.

Settings: ``KILN_SEND_TIMEOUT_S=2``, ``KILN_HEADER_TIMEOUT_S=2``, ``KILN_BODY_TIMEOUT_S=1``,
``KILN_MAX_CONNECTIONS_PER_CLIENT=8``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import SMOLLM2, KilnProcess, _start_kiln, data_dir, serve_model

pytestmark = pytest.mark.slow

ENV = {
    "KILN_SEND_TIMEOUT_S": "2",
    "KILN_HEADER_TIMEOUT_S": "2",
    "KILN_BODY_TIMEOUT_S": "1",
    "KILN_MAX_CONNECTIONS_PER_CLIENT": "8",
}
CHOICES = 16
EVENT_BYTES = 1500
"""At least this many bytes per streamed event of the slow-reader case (20 top logprobs)."""
SEND_BUFFER = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
"""The most the server's kernel buffers for one socket (``tcp_wmem``'s max; 4 MiB here)."""
MAX_TOKENS = min(max(600, 4 * SEND_BUFFER // (CHOICES * EVENT_BYTES)), 7000)
"""Enough that the stream outgrows the send buffer four times over, so the gateway's send waits."""
NO_END = {"0": -100, "1": -100, "2": -100}
"""SmolLM2's special tokens banned: every choice runs to ``max_tokens`` unless cut."""


@pytest.fixture(scope="module")
def kiln(smollm2_dir: Path) -> Iterator[KilnProcess]:
    with data_dir() as path:
        yield from serve_model(_start_kiln(path, [smollm2_dir], ENV), SMOLLM2, "completions")


def _address(kiln: KilnProcess) -> tuple[str, int]:
    host, port = kiln.base_url.removeprefix("http://").split(":")
    return host, int(port)


def _connect(kiln: KilnProcess, *, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:  # before connecting: it sets the window the server sees
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect(_address(kiln))
    return sock


def _request(method: str, path: str, kiln: KilnProcess, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: kiln", f"authorization: Bearer {kiln.key}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    if body or method == "POST":
        lines += ["content-type: application/json", f"content-length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _until_closed(sock: socket.socket, timeout: float = 15) -> bytes:
    """Everything the server sends until it closes (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response with a Content-Length (status, headers, body); the connection kept."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status, headers = _head(head)
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return status, headers, body


def _head(head: bytes) -> tuple[int, dict[str, str]]:
    first, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(first.split()[1]), headers


def _gateway_connections(kiln: KilnProcess) -> list[Any]:
    """The gateway's established connections on its listening port."""
    port = _address(kiln)[1]
    conns = psutil.Process(kiln.proc.pid).net_connections(kind="tcp")
    return [c for c in conns if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED]


def test_a_stream_whose_reader_stops_is_cut_freed_and_billed(kiln: KilnProcess) -> None:
    """The client reads the response head, then nothing: once the socket buffers are full (up
    to ``SEND_BUFFER``) the gateway's send waits, and after the send timeout it drops the
    connection; the generation is cancelled short of its ``max_tokens`` and billed (499) for
    the tokens it made."""
    body = json.dumps({
        "model": SMOLLM2, "max_tokens": MAX_TOKENS, "n": CHOICES, "temperature": 0.9, "seed": 7,
        "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
        "stream": True, "logprobs": True, "top_logprobs": 20,  # large events
        "logit_bias": NO_END,
    }).encode()  # fmt: skip
    sock = _connect(kiln, receive_buffer=4096)
    sock.sendall(_request("POST", "/v1/chat/completions", kiln, body))
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    status, headers = _head(head.split(b"\r\n\r\n")[0])
    assert status == 200
    request_id, start = headers["x-request-id"], time.monotonic()
    cuts = kiln.metric('kiln_http_clients_cut_total{reason="send_timeout"}')
    rows: list[Any] = []
    wait = 60 + SEND_BUFFER / 100_000  # filling the buffer at ~150 events/s takes a while
    while not rows and time.monotonic() - start < wait:
        time.sleep(0.5)
        sql = "SELECT status, output_tokens FROM usage_events WHERE request_id = :id"
        rows = kiln.sql(sql, id=request_id)
    elapsed = time.monotonic() - start
    assert rows, f"no usage row {wait:.0f} s after the reader stopped"
    ((billed_status, tokens),) = rows
    assert billed_status == 499, (billed_status, tokens, elapsed)  # cut, not finished
    assert 0 < tokens < MAX_TOKENS * CHOICES
    local_port = sock.getsockname()[1]
    assert all(c.raddr.port != local_port for c in _gateway_connections(kiln))  # dropped
    assert kiln.metric('kiln_http_clients_cut_total{reason="send_timeout"}') == cuts + 1
    assert kiln.metric("kiln_llm_active_generations") == 0  # its slot freed
    sock.close()


def test_a_connection_that_sends_nothing_gets_408_and_is_closed(kiln: KilnProcess) -> None:
    sock = _connect(kiln)
    start = time.monotonic()
    data = _until_closed(sock)
    elapsed = time.monotonic() - start
    sock.close()
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert b"did not arrive within 2 s" in data
    assert 1.5 < elapsed < 6, elapsed


def test_headers_trickled_a_line_at_a_time_are_cut_at_the_timeout(kiln: KilnProcess) -> None:
    """Every line comes before any idle timer would fire; the headers' deadline still holds."""
    sock = _connect(kiln)
    start = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: kiln\r\n")
    data = b""
    for i in range(60):  # 15 s of headers, if nothing stopped them
        sock.settimeout(0.25)
        try:
            data = sock.recv(65536)
            break
        except TimeoutError:
            sock.sendall(f"x-line-{i}: a\r\n".encode())
    data += _until_closed(sock, timeout=5)
    elapsed = time.monotonic() - start
    sock.close()
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert 1.5 < elapsed < 6, elapsed


def test_headers_over_64_kib_get_431(kiln: KilnProcess) -> None:
    sock = _connect(kiln)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: kiln\r\nx-big: " + b"a" * (70 << 10) + b"\r\n")
    data = _until_closed(sock)
    sock.close()
    assert data.startswith(b"HTTP/1.1 431 "), data[:200]


@pytest.mark.parametrize("how", ["stalls", "trickles"])
def test_a_body_that_stalls_or_trickles_gets_408_and_the_connection_closes(
    kiln: KilnProcess, how: str
) -> None:
    body = json.dumps({"model": SMOLLM2, "prompt": "x" * 2000, "max_tokens": 1}).encode()
    sock = _connect(kiln)
    sock.sendall(_request("POST", "/v1/completions", kiln, body)[: -len(body)] + body[:10])
    start, data, sent = time.monotonic(), b"", 10
    while not data and time.monotonic() - start < 15:
        sock.settimeout(0.2)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            if how == "trickles":  # 5 bytes a second: under the 1 KiB/s a body must average
                sock.sendall(body[sent : sent + 1])
                sent += 1
    data += _until_closed(sock, timeout=5)
    elapsed = time.monotonic() - start
    sock.close()
    status, headers = _head(data.split(b"\r\n\r\n")[0])
    assert status == 408, data
    assert headers["connection"] == "close"
    error = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout"
    assert "The request body stalled" in error["message"]
    assert elapsed < 6, elapsed


def test_a_ninth_connection_from_one_address_gets_429_and_is_closed(kiln: KilnProcess) -> None:
    deadline = time.monotonic() + 15  # earlier tests' connections (keep-alives) gone
    while _gateway_connections(kiln) and time.monotonic() < deadline:
        time.sleep(0.2)
    socks = [_connect(kiln) for _ in range(8)]
    for sock in socks:  # each answered, and kept alive
        sock.sendall(_request("GET", "/healthz", kiln))
        assert _response(sock)[0] == 200
    ninth = _connect(kiln)
    ninth.sendall(_request("GET", "/v1/models", kiln))
    data = _until_closed(ninth)
    ninth.close()
    status, headers = _head(data.split(b"\r\n\r\n")[0])
    assert status == 429, data
    assert headers["retry-after"] == "1"
    assert headers["connection"] == "close"
    error = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
    assert "at most 8 at once" in error["message"]
    socks.pop().close()  # one of the eight closes: a new connection is served
    deadline = time.monotonic() + 5
    while True:
        sock = _connect(kiln)
        sock.sendall(_request("GET", "/healthz", kiln))
        status = _response(sock)[0]
        sock.close()
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200
    for sock in socks:
        sock.close()
