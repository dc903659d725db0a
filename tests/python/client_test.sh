#!/usr/bin/env bash
# The Python client against a real megatraind: `pip install client/python` into a temporary
# venv (--system-site-packages: Debian's python3-grpcio, python3-protobuf and python3-pytest;
# --no-index: nothing is downloaded), a daemon on a Unix socket plus a TLS TCP listener with a
# bearer token, then pytest (client_test.py) writing its JUnit XML to $XML_OUTPUT_FILE.
source "${TEST_SRCDIR}/megatrain/tests/server/daemon_test_lib.sh"
PY=/usr/bin/python3
"$PY" -c 'import grpc, google.protobuf, pytest, venv' ||
  fail "$PY lacks grpcio, protobuf, pytest or venv: run scripts/setup"

# 1. Install: a copy of client/python beside proto/, as in a checkout (the build writes there).
mkdir -p "$WORK/src/client"
cp -rL "$RUNFILES/client/python" "$WORK/src/client/python"
cp -rL "$RUNFILES/proto" "$WORK/src/proto"
"$PY" -m venv --system-site-packages "$WORK/venv" || fail "venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
  "$WORK/venv/bin/pip" install --no-index --quiet "$WORK/src/client/python" > "$WORK/pip.log" 2>&1 ||
  fail "pip install client/python: $(tail -n 20 "$WORK/pip.log")"

# 2. A daemon: Unix socket, and TCP with TLS (a self-signed localhost certificate) and a token.
mkdir -p "$WORK/tls"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost \
  -addext subjectAltName=DNS:localhost -keyout "$WORK/tls/key.pem" -out "$WORK/tls/cert.pem" \
  > "$WORK/tls/openssl.log" 2>&1 || fail "openssl: $(cat "$WORK/tls/openssl.log")"
echo "python-client-token-0123456789" > "$WORK/tls/token"
port=$(free_port)
start_daemon --tcp_address="127.0.0.1:$port" --tls_cert_file="$WORK/tls/cert.pem" \
  --tls_key_file="$WORK/tls/key.pem" --token_file="$WORK/tls/token"

# 3. pytest with the venv's Python; the test module's own directory holds no `megatrain`, so the
# import finds the installed package (client_test.py checks it).
xml=()
[ -n "${XML_OUTPUT_FILE:-}" ] && xml=(--junitxml="$XML_OUTPUT_FILE")
set +e
(cd "$RUNFILES" && MEGATRAIN_SOCKET="$SOCKET" MEGATRAIN_WORK="$WORK" \
  MEGATRAIN_ADDRESS="localhost:$port" MEGATRAIN_TOKEN_FILE="$WORK/tls/token" \
  MEGATRAIN_CA_FILE="$WORK/tls/cert.pem" MEGATRAIN_VENV="$WORK/venv" PYTHONDONTWRITEBYTECODE=1 \
  timeout 600 "$WORK/venv/bin/python" -m pytest -p no:cacheprovider -v --basetemp="$WORK/pytest" \
  "${xml[@]}" tests/python/client_test.py)
rc=$?
set -e
# pytest's XML counts its cases in scripts/test. A failure it does not record there (exit 2-5:
# interrupted, internal error, usage, no tests; a timeout; the daemon's exit below) removes the
# XML, so that Bazel writes its own, which counts this target as failed.
eval "lib_$(declare -f fail)"
fail() { [ -n "${XML_OUTPUT_FILE:-}" ] && rm -f "$XML_OUTPUT_FILE"; lib_fail "$@"; }
[ "$rc" = 1 ] && lib_fail "pytest: some cases failed (see above)"
[ "$rc" = 0 ] || fail "pytest exited $rc"
stop_daemon
echo PASS
