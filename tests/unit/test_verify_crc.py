from __future__ import annotations

import pytest

from stateops.core.formats import hadoop_crc
from stateops.core.verify import verify_crc

pytestmark = pytest.mark.unit

DATA = bytes(range(256)) * 5  # 1280 bytes: three 512-byte chunks, the last one partial


def test_a_matching_sidecar_passes():
    assert verify_crc(DATA, hadoop_crc(DATA)) is None
    assert verify_crc(b"", hadoop_crc(b"")) is None


def test_a_flipped_byte_names_its_chunk():
    damaged = bytearray(DATA)
    damaged[600] ^= 0xFF
    assert verify_crc(bytes(damaged), hadoop_crc(DATA)) == "checksum mismatch in bytes 512..1023"


def test_truncation_and_bad_headers():
    assert "truncated or extended" in verify_crc(DATA[:500], hadoop_crc(DATA))
    assert verify_crc(DATA, b"xyz") == "checksum sidecar has no 'crc' header"
    assert "bytes per checksum" in verify_crc(DATA, b"crc\x00\x00\x00\x00\x00")
