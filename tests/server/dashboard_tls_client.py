"""Python ssl clients for dashboard_tls_test.sh (standard library only).

  stall PORT           TLS handshakes that stall (nothing sent; half a record header) are closed
                       by the daemon within its request deadline (bounded wait 60 s).
  events PORT CA TOKEN JOB
                       /api/events?job=JOB carries a "job" event for a later training step than
                       the first one seen (synchronised on the stream's events; bounded 120 s).
  cap PORT CA TOKEN N  N event streams open at once; stream N+1 is answered 503.
"""
import json
import select
import socket
import ssl
import sys
import time


def tls(port, ca):
    context = ssl.create_default_context(cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def closed_by_peer(sock, deadline):
    """True when the peer closes `sock` before `deadline` (what it sends is dropped)."""
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.2)[0]:
            try:
                if not sock.recv(4096):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
    return False


def stall(port):
    silent = socket.create_connection(("127.0.0.1", port))
    partial = socket.create_connection(("127.0.0.1", port))
    partial.sendall(b"\x16\x03\x01\x02")  # a TLS handshake record header, cut short
    deadline = time.monotonic() + 60
    for name, sock in (("silent", silent), ("partial", partial)):
        if not closed_by_peer(sock, deadline):
            sys.exit(f"the daemon kept a stalled ({name}) TLS handshake open for 60 s")
    print("stalled handshakes closed")


def request(sock, target, token):
    sock.sendall((f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n").encode())


def read_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head.decode(), rest


def events(port, ca, token, job):
    # Streams closed just before (cap) free their slots within the daemon's one-second check.
    retry_until = time.monotonic() + 30
    while True:
        sock = tls(port, ca)
        request(sock, f"/api/events?job={job}", token)
        head, buffer = read_head(sock)
        if not head.startswith("HTTP/1.1 503") or time.monotonic() > retry_until:
            break
        sock.close()
        time.sleep(0.2)
    if not head.startswith("HTTP/1.1 200") or "text/event-stream" not in head:
        sys.exit(f"/api/events answered: {head!r}")
    deadline = time.monotonic() + 120
    first_step = None
    kinds = set()
    while time.monotonic() < deadline:
        while b"\n\n" in buffer:
            block, _, buffer = buffer.partition(b"\n\n")
            fields = dict(line.split(": ", 1) for line in block.decode().split("\n")
                          if ": " in line and not line.startswith(":"))
            kinds.add(fields.get("event"))
            if fields.get("event") != "job":
                continue
            step = int(json.loads(fields["data"])["job"]["progress"].get("step", "0"))
            if first_step is None:
                first_step = step
            elif step > first_step:
                print(f"event for step {step} after step {first_step}; "
                      f"events seen: {sorted(kinds)}")
                if "jobs" not in kinds:
                    sys.exit("no 'jobs' event")
                return
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            sys.exit("the event stream closed")
        buffer += chunk
    sys.exit(f"no event for a later step within 120 s (first step {first_step})")


def cap(port, ca, token, n):
    held = []
    for _ in range(n):
        sock = tls(port, ca)
        request(sock, "/api/events", token)
        head, _ = read_head(sock)
        if not head.startswith("HTTP/1.1 200"):
            sys.exit(f"stream {len(held) + 1} of {n} answered {head!r}")
        held.append(sock)
    sock = tls(port, ca)
    request(sock, "/api/events", token)
    head, _ = read_head(sock)
    if not head.startswith("HTTP/1.1 503"):
        sys.exit(f"stream {n + 1} (over max_event_streams) answered {head!r}")
    for s in held:
        s.close()
    print(f"{n} streams held, the next one got 503")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "stall":
        stall(int(sys.argv[2]))
    elif mode == "events":
        events(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    elif mode == "cap":
        cap(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(f"unknown mode {mode}")
