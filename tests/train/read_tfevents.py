#!/usr/bin/env python3
"""Reads TensorBoard event files with code independent of libtarantella: its own CRC-32C
(bit by bit) and its own protobuf wire-format decoding of Event / Summary (TensorFlow's field
numbers). Prints one JSON object per record; exits 1 naming the file and byte offset when a
record is truncated or a CRC does not match.

    read_tfevents.py FILE...
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    value, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf):
    """(field number, wire type, value) of one message; value is int, bytes or raw bytes."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wire)
        yield number, wire, value


def parse_event(data):
    event = {"wall_time": None, "step": 0, "file_version": None, "values": {}}
    for number, wire, value in fields(data):
        if number == 1 and wire == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3 and wire == 2:
            event["file_version"] = value.decode()
        elif number == 5 and wire == 2:
            for vnum, vwire, vbytes in fields(value):
                if vnum != 1 or vwire != 2:
                    continue
                tag, simple = None, None
                for n, w, v in fields(vbytes):
                    if n == 1 and w == 2:
                        tag = v.decode()
                    elif n == 2 and w == 5:
                        simple = struct.unpack("<f", v)[0]
                event["values"][tag] = simple
    return event


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset < len(data):
        if len(data) - offset < 12:
            sys.exit("%s: truncated header at byte offset %d" % (path, offset))
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if masked(header) != length_crc:
            sys.exit("%s: length CRC mismatch at byte offset %d" % (path, offset))
        end = offset + 12 + length + 4
        if end > len(data):
            sys.exit("%s: truncated record at byte offset %d" % (path, offset))
        body = data[offset + 12:offset + 12 + length]
        (data_crc,) = struct.unpack("<I", data[end - 4:end])
        if masked(body) != data_crc:
            sys.exit("%s: data CRC mismatch at byte offset %d" % (path, offset))
        yield body
        offset = end


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        for body in records(path):
            print(json.dumps(parse_event(body)))


if __name__ == "__main__":
    main()
