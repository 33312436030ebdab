"""CURVE authentication and encryption (ZeroMQ RFC 26 CurveZMQ, RFC 27 ZAP).

* `keygen` writes a keypair with pyzmq's ``zmq.auth.create_certificates``
  (``NAME.key`` public, ``NAME.key_secret`` secret, mode 0600).
* A worker loads its secret key and a directory of allowed client public
  keys; only those clients complete the handshake, so nothing from anyone
  else is ever received, let alone run.
* The worker answers ZAP requests with ``zqsync/worker/auth.py``.
* Secret key files readable by group or others are refused.
"""

from __future__ import annotations

import os
import stat
from typing import Any, NamedTuple, Optional

import zmq
import zmq.auth

from ..errors import ConfigurationError


class Curve(NamedTuple):
    """A client's CURVE keys, Z85-encoded: the worker's public key, and the client's own pair.

    ``files`` is ``(server public key file, client secret key file)`` when the keys were loaded
    with `from_files`: such a ``Curve`` pickles as those paths, and unpickling loads the
    files again, so the secret key never travels inside a pickle.
    """

    server_public: bytes
    public: bytes
    secret: bytes
    files: Optional[tuple[str, str]] = None

    def __reduce__(self) -> Any:
        if self.files is not None:
            return type(self).from_files, self.files
        return type(self), (self.server_public, self.public, self.secret)

    @classmethod
    def from_files(cls, server_public: str, client_secret: str) -> "Curve":
        """Load keys written by ``zqsync keygen``.

        :param server_public: the worker's ``NAME.key`` file.
        :param client_secret: this client's ``NAME.key_secret`` file (holds both halves).
        :raises ConfigurationError: a file is missing, malformed, or the secret is readable by others.
        """
        server_key, _ = load_public(server_public)
        public, secret = load_secret(client_secret)
        return cls(server_key, public, secret, (os.path.abspath(server_public), os.path.abspath(client_secret)))

    def client_options(self) -> dict[int, bytes]:
        """Socket options that make a connecting socket a CURVE client."""
        return {zmq.CURVE_SERVERKEY: self.server_public, zmq.CURVE_PUBLICKEY: self.public, zmq.CURVE_SECRETKEY: self.secret}


def keygen(directory: str, name: str) -> tuple[str, str]:
    """Write a new keypair ``DIRECTORY/NAME.key`` and ``DIRECTORY/NAME.key_secret`` (mode 0600).

    :returns: the public and secret file paths.
    :raises ConfigurationError: the files exist already (keys are never overwritten).
    """
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, name)
    for path in (f"{base}.key", f"{base}.key_secret"):
        if os.path.exists(path):
            raise ConfigurationError(f"{path} exists; refusing to overwrite a key", setting="name")
    old_umask = os.umask(0o077)
    try:
        public, secret = zmq.auth.create_certificates(directory, name)
    finally:
        os.umask(old_umask)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    return public, secret


def _load(path: str) -> tuple[bytes, Any]:
    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot load CURVE key {path!r}: {exc}", setting="curve") from exc


def load_public(path: str) -> tuple[bytes, None]:
    """The public key in ``path``. :raises ConfigurationError: unreadable or malformed."""
    public, _ = _load(path)
    return public, None


def load_secret(path: str) -> tuple[bytes, bytes]:
    """The ``(public, secret)`` keys in a ``.key_secret`` file.

    :raises ConfigurationError: unreadable, malformed, holds no secret key, or
        readable by group or others (``chmod 600`` it).
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigurationError(f"cannot read CURVE secret key {path!r}: {exc}", setting="curve") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigurationError(
            f"CURVE secret key {path!r} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
            f"run: chmod 600 {path}", setting="curve",
        )
    public, secret = _load(path)
    if not secret:
        raise ConfigurationError(f"{path!r} holds no secret key (use the .key_secret file)", setting="curve")
    return public, secret


def server_options(secret_file: str) -> dict[int, Any]:
    """Socket options that make a bound socket a CURVE server with the key in ``secret_file``."""
    public, secret = load_secret(secret_file)
    return {zmq.CURVE_SERVER: 1, zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret}


def check_allow_dir(directory: str) -> None:
    """:raises ConfigurationError: ``directory`` does not exist or holds no ``*.key`` file."""
    if not os.path.isdir(directory) or not any(name.endswith(".key") for name in os.listdir(directory)):
        raise ConfigurationError(f"--allow-client-keys {directory!r} holds no client public keys (*.key)",
                                 setting="allow_client_keys")
