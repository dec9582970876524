#!/usr/bin/env bash
# Make a local certificate authority and certificates for tests and trying TLS:
#
#   scripts/make-test-ca.sh DIR [CLIENT_NAME ...]
#
# writes into DIR (created if needed):
#   ca.pem, ca.key             the CA (self-signed, 30 days)
#   server.pem, server.key     a server certificate for localhost / 127.0.0.1 / ::1
#                              (extra names: SERVER_NAMES="DNS:gate.internal,IP:10.0.0.5")
#   NAME.pem, NAME.key         a client certificate whose subject CN is NAME, for each
#                              CLIENT_NAME (default: gate alice)
# Keys are EC P-256, unencrypted: for tests and local use, not for production.
set -euo pipefail

dir=${1:?usage: make-test-ca.sh DIR [CLIENT_NAME ...]}
shift
clients=("$@")
[ ${#clients[@]} -eq 0 ] && clients=(gate alice)
days=${DAYS:-30}
san="DNS:localhost,IP:127.0.0.1,IP:::1${SERVER_NAMES:+,$SERVER_NAMES}"

mkdir -p "$dir"
cd "$dir"
umask 077

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -sha256 -days "$days" -subj "/CN=shardgate test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem 2>/dev/null

sign() {  # name subject extensions
  key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -sha256 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

sign server "/CN=localhost" "subjectAltName=$san
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature"
for name in "${clients[@]}"; do
  sign "$name" "/CN=$name" "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
done
rm -f ca.srl
chmod 644 ./*.pem
echo "certificates in $(pwd): ca.pem server.pem ${clients[*]/%/.pem}"
