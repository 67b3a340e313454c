"""Punctual-Signature: one v1 per signing secret, and a verifier that takes any of them."""

from __future__ import annotations

import pytest

from punctual_client import SignatureError, verify_signature
from punctual_client.signature import signature_header

BODY = b'{"report":"daily"}'
T = 1_700_000_000


def test_one_secret_signs_one_v1():
    header = signature_header("whsec_a", BODY, T)
    assert header.startswith(f"t={T},v1=") and header.count("v1=") == 1
    verify_signature("whsec_a", header, BODY, now=T)


def test_a_rotation_signs_with_the_new_secret_first_then_the_old():
    header = signature_header(("whsec_new", "whsec_old"), BODY, T)
    t, new, old = header.split(",")
    assert t == f"t={T}"
    assert new == signature_header("whsec_new", BODY, T).split(",")[1]
    assert old == signature_header("whsec_old", BODY, T).split(",")[1]
    for secret in ("whsec_new", "whsec_old", ["whsec_other", "whsec_old"]):
        verify_signature(secret, header, BODY, now=T)


@pytest.mark.parametrize("secret", ["whsec_other", ["whsec_x", "whsec_y"]])
def test_no_secret_that_matches_is_refused(secret):
    header = signature_header(("whsec_new", "whsec_old"), BODY, T)
    with pytest.raises(SignatureError, match="does not match"):
        verify_signature(secret, header, BODY, now=T)


def test_a_verifier_holding_both_secrets_accepts_calls_signed_by_either():
    for signer in ("whsec_new", "whsec_old"):
        verify_signature(["whsec_new", "whsec_old"], signature_header(signer, BODY, T), BODY, now=T)


def test_tampering_staleness_and_malformed_headers_are_refused():
    header = signature_header(("whsec_new", "whsec_old"), BODY, T)
    with pytest.raises(SignatureError, match="does not match"):
        verify_signature("whsec_old", header, BODY + b" ", now=T)
    with pytest.raises(SignatureError, match="away from now"):
        verify_signature("whsec_old", header, BODY, now=T + 301)
    for bad in (None, "", "v1=abc", f"t={T}", "t=x,v1=abc"):
        with pytest.raises(SignatureError):
            verify_signature("whsec_old", bad, BODY, now=T)
    with pytest.raises(SignatureError, match="no signing secret"):
        verify_signature([], header, BODY, now=T)
