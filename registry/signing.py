"""What a registry vouches for, signed with its own ed25519 key (`cryptography`), and checked by
every install against that key as this machine first saw it.

The registry signs two kinds of record, each a canonical JSON text (sorted keys, no spaces):
- `version`: owner, name, version and the package's sha256 digest, when it is published;
- `verification`: the result of an audit the registry's own workers ran on that digest
  (registry/verify.py): status verified or flagged, date, envhub version, sandboxes, rows.

The server stores the record text and its signature at the moment it signs them. Whoever can
edit the registry's database or blob folder afterwards cannot make an install accept what the
registry did not sign: a changed blob no longer has the signed digest, an edited record no
longer verifies, and a record copied from another version names that other version or digest.

Owners may sign their uploads too (`envhub publish --sign KEY`): the registry's operator
registers an owner's public key (`envhub registry publisher-key`), after which the registry
takes that owner's uploads only with a valid signature of the same version record, kind
`publisher`, keeps it, and serves it; `install` checks it with the owner's key as this machine
first saw it. So a registry whose database and key are both taken still cannot hand out a
package as that owner's.

The key lives in the registry's data folder (`signing.key`, 0600, made on first use; several
`serve` processes on one data folder share it). Clients pin the registry's public key on first
use in `<ENVHUB_HOME>/registry_keys.json` (or take it from `ENVHUB_REGISTRY_KEY`) and refuse a
registry that later signs with another key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from envhub.registry.errors import RegistryError

KEY_FILE = "signing.key"
PINS_FILE = "registry_keys.json"
KEY_ENV = "ENVHUB_REGISTRY_KEY"
MAX_RECORD_CHARS = 16_384


class SignatureError(RegistryError):
    """What a registry served does not carry a valid signature of its key (refused)."""

    code = "bad_signature"


def canonical(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def key_id(public: bytes) -> str:
    return "ed25519:" + hashlib.sha256(public).hexdigest()[:32]


class RegistryKey:
    """The registry's signing key (server side)."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public = private.public_key().public_bytes(serialization.Encoding.Raw,
                                                        serialization.PublicFormat.Raw)
        self.key_id = key_id(self.public)
        self.public_b64 = base64.b64encode(self.public).decode("ascii")

    @classmethod
    def load_or_create(cls, data: Path) -> RegistryKey:
        path = data / KEY_FILE
        if not path.exists():
            pem = Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption())
            fd, tmp = tempfile.mkstemp(dir=data, prefix=".signing-")
            try:
                os.write(fd, pem)
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # never replaces a key another process made meanwhile
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(private, Ed25519PrivateKey):
            raise RegistryError(f"{path} is not an ed25519 key; move it away and restart")
        return cls(private)

    def sign(self, record: dict[str, Any]) -> tuple[str, str]:
        """(the record's canonical text, its base64 signature)."""
        text = canonical(record)
        return text, base64.b64encode(self._private.sign(text.encode("ascii"))).decode("ascii")


def check_signed(public_b64: str, record_text: str, signature: str,
                 what: str, signer: str = "the registry") -> dict[str, Any]:
    """The record, once its signature verifies with `public_b64`; SignatureError otherwise."""
    if len(record_text) > MAX_RECORD_CHARS or len(signature) > 200:
        raise SignatureError(f"{what}: the signed record is oversized; refused")
    try:
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_b64,
                                                                     validate=True))
        public.verify(base64.b64decode(signature, validate=True), record_text.encode("ascii"))
        record = json.loads(record_text)
    except (InvalidSignature, ValueError, binascii.Error, UnicodeEncodeError):
        raise SignatureError(f"{what}: its record does not carry a valid signature of "
                             f"{signer}'s key (the record or its signature was changed after "
                             f"{signer} signed it); refused") from None
    if not isinstance(record, dict):
        raise SignatureError(f"{what}: the signed record is not an object; refused")
    return record


def pins_path(home: Path) -> Path:
    return home / PINS_FILE


def _pins(home: Path) -> dict[str, dict[str, str]]:
    path = pins_path(home)
    try:
        pins = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise SignatureError(f"cannot read {path} ({e}); fix or remove it") from None
    if not isinstance(pins, dict):
        raise SignatureError(f"{path} is not a JSON object; fix or remove it")
    return pins


def pinned_key(home: Path, location: str, served_b64: str, served_id: str) -> str:
    """The public key to check `location`'s signatures with: `ENVHUB_REGISTRY_KEY` when set,
    else the one pinned for it (the served one when none is pinned yet: `pin` records it once
    an install succeeded). A registry that serves another key is refused (SignatureError)."""
    configured = os.environ.get(KEY_ENV, "").strip()
    if configured:
        if configured not in (served_b64, served_id):
            raise SignatureError(f"{location} signs with key {served_id}, not the "
                                 f"{KEY_ENV} this machine is configured with; refused")
        return served_b64
    pin = _pins(home).get(location)
    if pin is not None and not isinstance(pin, dict):
        raise SignatureError(f"{pins_path(home)}: the entry of {location} is not an object; "
                             "fix or remove it")
    if pin is not None and pin.get("key") != served_b64:
        raise SignatureError(
            f"{location} now signs with key {served_id}, but this machine pinned "
            f"{pin.get('key_id')} the first time it used it: the registry's key changed or "
            f"someone else answers at that address; refused. If the registry's admin rotated "
            f"the key on purpose, remove its entry from {pins_path(home)}")
    return served_b64


def pin(home: Path, location: str, served_b64: str, served_id: str) -> None:
    """Record `location`'s key on first use (after the first install from it succeeded)."""
    pins = _pins(home)
    if location in pins or os.environ.get(KEY_ENV, "").strip():
        return
    pins[location] = {"key": served_b64, "key_id": served_id}
    _save_pins(home, pins)


def _save_pins(home: Path, pins: dict[str, dict[str, str]]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=home, prefix=".registry-keys-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(pins, f, indent=1, sort_keys=True)
    os.replace(tmp, pins_path(home))


def publisher_record(owner: str, name: str, version: str, digest: str) -> dict[str, str]:
    """What a publisher signs for one upload (`envhub publish --sign`)."""
    return {"kind": "publisher", "owner": owner, "name": name, "version": version,
            "digest": digest}


def generate_publisher_key(path: Path) -> str:
    """A new ed25519 key at `path` (PEM, 0600, never over an existing file) and its public key,
    base64, also written to `path`.pub; returns the public key."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise RegistryError(f"{path} exists; choose another --out (a key is never "
                            "overwritten)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = base64.b64encode(private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode("ascii")
    Path(f"{path}.pub").write_text(public + "\n", encoding="ascii")
    return public


def sign_as_publisher(key_file: Path, record: dict[str, Any]) -> tuple[str, str]:
    """(the key's id, the base64 signature of `record`) with the private key in `key_file`."""
    try:
        private = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise RegistryError(f"--sign {key_file}: not a readable unencrypted PEM private key "
                            f"({e}); make one with `envhub registry keygen`") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise RegistryError(f"--sign {key_file}: not an ed25519 key; make one with "
                            "`envhub registry keygen`")
    public = private.public_key().public_bytes(serialization.Encoding.Raw,
                                               serialization.PublicFormat.Raw)
    signature = private.sign(canonical(record).encode("ascii"))
    return key_id(public), base64.b64encode(signature).decode("ascii")


def check_public_key(text: str) -> tuple[str, str]:
    """(the base64 public key, its id) of an ed25519 public key given as base64; RegistryError
    naming the fix otherwise."""
    value = text.strip()
    try:
        raw = base64.b64decode(value, validate=True)
        Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, binascii.Error):
        raise RegistryError("not an ed25519 public key (base64 of its 32 bytes, as "
                            "`envhub registry keygen` writes to KEY.pub)") from None
    return value, key_id(raw)


def pinned_owner_key(home: Path, location: str, owner: str, served_b64: str,
                     served_id: str) -> None:
    """Refuse (SignatureError) an owner key other than the one this machine first saw for
    `owner` at `location`; record it on first use."""
    pins = _pins(home)
    entry = f"{location} owner {owner}"
    pin = pins.get(entry)
    if pin is not None and (not isinstance(pin, dict) or pin.get("key") != served_b64):
        raise SignatureError(
            f"{owner}'s publisher key at {location} is now {served_id}, but this machine "
            f"pinned {pin.get('key_id') if isinstance(pin, dict) else pin} the first time: the "
            f"owner's key was replaced on the registry; refused. If {owner} rotated it on "
            f"purpose, remove the entry '{entry}' from {pins_path(home)}")
    if pin is None:
        pins[entry] = {"key": served_b64, "key_id": served_id}
        _save_pins(home, pins)
