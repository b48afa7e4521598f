"""Host key fingerprints as OpenSSH prints them, so a mismatch message can be compared with `ssh-keygen -lf`."""

import base64

import pytest

from fleetgen.nodes.host_keys import describe, describe_public_line, fingerprint

# A real public key line and what `ssh-keygen -lf` prints for it (OpenSSH 9).
KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDjPkDH4OkNT1NYaRNbOrtKaFxl+Kj+//lVzhw4qOCd5 root@gpu-node-1"
KEY_FINGERPRINT = "SHA256:JQjIRsgR3bFCV8RQs/tAXDWii2Ewd6W78hPdEWU5n2o"
KEY_BLOB = base64.b64decode(KEY_LINE.split()[1])


def test_the_fingerprint_is_what_ssh_keygen_prints_without_base64_padding():
    assert fingerprint(KEY_BLOB) == KEY_FINGERPRINT
    # SHA-256 is 32 bytes: base64 ends in one '=', which OpenSSH leaves out.
    assert not fingerprint(b"").endswith("=") and fingerprint(b"") == "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"


def test_a_key_is_described_by_its_type_then_its_fingerprint():
    assert describe("ssh-ed25519", KEY_BLOB) == f"ssh-ed25519 {KEY_FINGERPRINT}"


@pytest.mark.parametrize("line", [KEY_LINE, " ".join(KEY_LINE.split()[:2]), KEY_LINE + " with spaces in the comment",
                                  f"  {KEY_LINE}\n"])
def test_a_public_key_line_with_or_without_comment_becomes_type_and_fingerprint(line):
    assert describe_public_line(line) == f"ssh-ed25519 {KEY_FINGERPRINT}"


def test_a_bare_base64_blob_is_described_as_a_key():
    assert describe_public_line(KEY_LINE.split()[1]) == f"key {KEY_FINGERPRINT}"


@pytest.mark.parametrize("text, shown", [
    ("", "(none)"),
    ("   \n", "(none)"),
    ("  not a key at all  ", "not a key at all"),
    # Base64 letters around a character outside the alphabet: a lenient decoder would drop the '!' and
    # describe a key that is not there.
    ("abcd!", "abcd!"),
    ("ssh-ed25519 AAAA!AAA", "ssh-ed25519 AAAA!AAA"),
])
def test_text_that_is_not_a_public_key_is_shown_as_it_is(text, shown):
    assert describe_public_line(text) == shown


def test_a_long_text_that_is_not_a_key_is_cut_to_80_characters():
    text = "x" * 79 + "!" + "y" * 40
    assert describe_public_line(text) == "x" * 79 + "!"
