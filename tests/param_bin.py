"""Test support: ncnn's binary params (``.param.bin``, what ``Net::load_param_bin`` reads), written from a text
``.param`` as ncnn's ncnn2mem tool writes them (ncnn's sdist does not ship the tool).

The format, as ncnn's ``Net::load_param_bin`` and ``ParamDict::load_param_bin`` read it: int32 words, little-endian:
the magic number, the layer and blob counts; per layer its type index, bottom and top counts, the bottoms' and the
tops' blob indexes (blobs numbered in the order layers make them), then its params: ``id, value`` (the value's bits:
an int, or a float where the text has '.', 'e' or 'E'), ``-23300 - id, n, n values`` for an array, ``-23400 - id,
n, n bytes padded to a word`` for a string (``6="0w,-1"``), ended by -233.
A type ncnn does not know gets ``LayerType::CustomBit | j`` (256 | j), j counting such types in the order they first
appear, as ncnn2mem numbers them (its .id.h's ``TYPEINDEX_`` constants).
"""
from __future__ import annotations

import struct
from typing import Callable

CUSTOM_BIT = 1 << 8
END_OF_PARAMS = -233


def _bits(word: str) -> int:
    """A value as ncnn2mem stores it: a float's bits where the word reads as a float (ncnn's rule), else the int."""
    if any(c in word for c in ".eE"):
        return struct.unpack("<i", struct.pack("<f", float(word)))[0]
    return int(word)


def words_bytes(words) -> bytes:
    """32-bit words as binary params hold them (little-endian ints)."""
    return struct.pack(f"<{len(words)}i", *words)


def to_param_bin(text: str, layer_to_index: Callable[[str], int]) -> tuple[bytes, list[str], list[str]]:
    """The binary params of the text .param `text` (one layer per line, as pnnx and vknorm optimize write them),
    with ncnn's type indexes from `layer_to_index` (ncnn's, -1 for a type it does not know). Returns the bytes, the
    blob names by index (where ncnn2mem's .id.h names them BLOB_<name>) and the custom types by j. A bottom no
    earlier layer makes is a ValueError (ncnn2mem cannot number it either)."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    magic, (layer_count, blob_count) = int(lines[0][0]), (int(w) for w in lines[1][:2])
    words = [magic, layer_count, blob_count]
    blobs: list[str] = []
    custom: list[str] = []
    for line in lines[2:2 + layer_count]:
        type_, name = line[0], line[1]
        n_bottoms, n_tops = int(line[2]), int(line[3])
        index = layer_to_index(type_)
        if index == -1:
            if type_ not in custom:
                custom.append(type_)
            index = CUSTOM_BIT | custom.index(type_)
        words += [index, n_bottoms, n_tops]
        for bottom in line[4:4 + n_bottoms]:
            if bottom not in blobs:
                raise ValueError(f"layer {name} reads {bottom}, which no earlier layer makes")
            words.append(blobs.index(bottom))
        for top in line[4 + n_bottoms:4 + n_bottoms + n_tops]:
            words.append(len(blobs))
            blobs.append(top)
        for item in line[4 + n_bottoms + n_tops:]:
            key, value = item.split("=", 1)
            pid = int(key)
            if pid <= -23300:  # an array as older .param files write it: -23300-id=n,v1,...
                count, *values = value.split(",")
                words += [pid, int(count), *(_bits(v) for v in values)]
            elif value[0] == '"' or value[0].isalpha():  # a string: quoted, or a word starting with a letter
                raw = value.strip('"').encode()
                raw += b"\0" * (-len(raw) % 4)
                words += [-23400 - pid, len(value.strip('"')), *struct.unpack(f"<{len(raw) // 4}i", raw)]
            elif "," in value:  # id=v1,v2,...
                values = value.split(",")
                words += [-23300 - pid, len(values), *(_bits(v) for v in values)]
            else:
                words += [pid, _bits(value)]
        words.append(END_OF_PARAMS)
    if len(blobs) != blob_count:
        raise ValueError(f"the header declares {blob_count} blobs, the layers make {len(blobs)}")
    return words_bytes(words), blobs, custom
