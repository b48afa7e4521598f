"""SSH host key fingerprints, written the way OpenSSH prints them (``SHA256:`` + unpadded base64).

A host key mismatch is reported with both fingerprints, so whoever reads the task log can compare
them with ``ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`` on the node (docs/security-and-ssh.md §3).
"""

from __future__ import annotations

import base64
import binascii
import hashlib


def fingerprint(blob: bytes) -> str:
    """``SHA256:...`` of a public key blob (the base64 field of an ``authorized_keys``/``host_key`` line)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def describe(key_type: str, blob: bytes) -> str:
    """``ssh-ed25519 SHA256:...``"""
    return f"{key_type} {fingerprint(blob)}"


def describe_public_line(text: str) -> str:
    """``ssh-ed25519 AAAA... [comment]`` (or a bare base64 blob) -> ``ssh-ed25519 SHA256:...``.

    Text that is not a public key is returned as is, cut short: the message must still say something.
    """
    words = text.split()
    if not words:  # an empty blob decodes as base64 too: its fingerprint would look like a real key's
        return "(none)"
    key_type, encoded = (words[0], words[1]) if len(words) >= 2 else ("key", words[0])
    try:
        return describe(key_type, base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        return text.strip()[:80]
