"""The Range server of the remote tests (range_server.py) behind TLS, with
a certificate made here, for the TLS tests (tests/remote_servers.rs).

    python3 tls_server.py DIR CERT_DIR KIND

Writes CERT_DIR/ca.pem, a private CA (the only certificate a client must
be given to trust the server), and serves DIR over HTTPS with a server
certificate it signed, as KIND says:

    good       for 127.0.0.1, valid now
    expired    for 127.0.0.1, expired a day ago
    wronghost  for the name other.invalid only

Listens on 127.0.0.1 and a free port, prints "PORT <n>" on stdout, and
exits when stdin closes (or it is killed). Needs the `cryptography`
package (in the tests' venv).
"""

import datetime
import ipaddress
import os
import ssl
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

root, cert_dir, kind = sys.argv[1], sys.argv[2], sys.argv[3]
# range_server.py reads its directory from argv when imported.
sys.argv = [sys.argv[0], root]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import range_server  # noqa: E402
import serving  # noqa: E402

now = datetime.datetime.now(datetime.timezone.utc)
day = datetime.timedelta(days=1)


def name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


ca_key = ec.generate_private_key(ec.SECP256R1())
ca = (
    x509.CertificateBuilder()
    .subject_name(name("ztensor-mount test CA"))
    .issuer_name(name("ztensor-mount test CA"))
    .public_key(ca_key.public_key())
    .serial_number(x509.random_serial_number())
    .not_valid_before(now - 10 * day)
    .not_valid_after(now + 10 * day)
    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    .add_extension(
        x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True,
            crl_sign=True, encipher_only=False, decipher_only=False,
        ),
        critical=True,
    )
    .sign(ca_key, hashes.SHA256())
)

key = ec.generate_private_key(ec.SECP256R1())
if kind == "wronghost":
    san = [x509.DNSName("other.invalid")]
else:
    san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
before, after = (now - 10 * day, now - day) if kind == "expired" else (now - day, now + 10 * day)
cert = (
    x509.CertificateBuilder()
    .subject_name(name("127.0.0.1" if kind != "wronghost" else "other.invalid"))
    .issuer_name(ca.subject)
    .public_key(key.public_key())
    .serial_number(x509.random_serial_number())
    .not_valid_before(before)
    .not_valid_after(after)
    .add_extension(x509.SubjectAlternativeName(san), critical=False)
    .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    .add_extension(
        x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
    )
    .sign(ca_key, hashes.SHA256())
)

os.makedirs(cert_dir, exist_ok=True)
pem = serialization.Encoding.PEM
with open(os.path.join(cert_dir, "ca.pem"), "wb") as f:
    f.write(ca.public_bytes(pem))
with open(os.path.join(cert_dir, "server.pem"), "wb") as f:
    f.write(cert.public_bytes(pem))
with open(os.path.join(cert_dir, "server.key"), "wb") as f:
    f.write(
        key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(os.path.join(cert_dir, "server.pem"), os.path.join(cert_dir, "server.key"))


class Server(range_server.Server):
    def get_request(self):
        sock, addr = super().get_request()
        # The handshake runs in the request's own thread (a client that
        # refuses the certificate must not stall the others).
        return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request, client_address):
        pass


class Handler(range_server.Handler):
    def setup(self):
        try:
            self.request.do_handshake()
        except (ssl.SSLError, OSError):
            self.request.close()
            raise
        super().setup()


if __name__ == "__main__":
    serving.serve(Server, Handler)
