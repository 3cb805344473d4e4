#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/), small valid
inputs the fuzzer mutates from. Run it again after changing a format; the files are
committed so that fuzzing needs nothing but the repository.
Needs Debian's python3-pil for the JPEG seeds."""
import gzip, io, json, os, struct, sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, "..", ".."))
corpus = os.path.join(here, "corpus")


def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(records):
    out = b""
    for r in records:
        n = struct.pack("<Q", len(r))
        out += n + struct.pack("<I", masked(n)) + r + struct.pack("<I", masked(r))
    return out


def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def example(features):
    """features: {name: ("bytes", [b..]) | ("int64", [i..]) | ("float", [f..])}"""
    entries = b""
    for name, (kind, values) in features.items():
        if kind == "bytes":
            lst = b"".join(field(1, 2, v) for v in values)
            feat = field(1, 2, lst)
        elif kind == "int64":
            feat = field(3, 2, field(1, 2, b"".join(varint(v & (2**64 - 1)) for v in values)))
        else:
            feat = field(2, 2, field(1, 2, b"".join(struct.pack("<f", v) for v in values)))
        entries += field(1, 2, field(1, 2, name.encode()) + field(2, 2, feat))
    return field(1, 2, entries)


def jpeg(w, h, mode="RGB", **kw):
    from PIL import Image
    img = Image.new(mode, (w, h))
    img.putdata([((x * 37 + y * 11) % 256,) * len(mode) if mode != "L" else (x * 37 + y * 11) % 256
                 for y in range(h) for x in range(w)])
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=80, **kw)
    return buf.getvalue()


def main():
    # Seeds are rewritten; inputs that once found a bug (regress-*) stay.
    for d, _, files in os.walk(corpus):
        for f in files:
            if not f.startswith("regress-"):
                os.remove(os.path.join(d, f))
    # hostfiles: the examples users see, and the forms the parser knows
    for f in sorted(os.listdir(os.path.join(root, "hostfiles"))):
        with open(os.path.join(root, "hostfiles", f), "rb") as src:
            put("hostfile", f, src.read())
    put("hostfile", "mixed", "# nodes\nnode1 slots=4\nnode2:2\nnode3\nnode1 slots=2  # again\n")
    put("hostfile", "list", "h1,h2:4,h3")
    # SLURM: node list, newline, tasks per node
    put("slurm", "ranges", "node[01-04,07],gpu5\n4(x2),2,1(x3)")
    put("slurm", "product", "r[1-2]n[001-003]\n2")
    put("slurm", "plain", "h1,h2\n1(x2)")
    # IDX: u8 images (magic 0x00000803) and labels (0x00000801), plain and gzip
    images = struct.pack(">I", 0x0803) + struct.pack(">III", 2, 3, 3) + bytes(range(18))
    labels = struct.pack(">I", 0x0801) + struct.pack(">I", 4) + bytes([0, 3, 9, 1])
    floats = struct.pack(">I", 0x0D02) + struct.pack(">II", 2, 2) + struct.pack(">4f", 1, -2, 0.5, 3)
    put("idx", "images", images)
    put("idx", "labels", labels)
    put("idx", "floats", floats)
    put("idx", "images.gz", gzip.compress(images, mtime=0))
    # safetensors: 8-byte header length, JSON header, data
    def safetensors(tensors, meta):
        header, data = {}, b""
        for name, (dtype, shape, raw) in tensors.items():
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        if meta:
            header["__metadata__"] = meta
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        return struct.pack("<Q", len(h)) + h + data
    put("safetensors", "checkpoint", safetensors(
        {"fc.weight": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
         "fc.bias": ("F32", [2], struct.pack("<2f", 0.5, -0.5)),
         "bn.num_batches_tracked": ("I64", [], struct.pack("<q", 7))},
        {"format": "pt", "epoch": "2", "step": "40", "optimizer": "sgd"}))
    put("safetensors", "half", safetensors({"w": ("BF16", [3], b"\x80\x3f\x00\x40\x40\x40")}, None))
    put("safetensors", "empty", safetensors({}, {"format": "pt"}))
    # JPEG: colour, grey, progressive
    put("jpeg", "rgb", jpeg(16, 12))
    put("jpeg", "grey", jpeg(9, 7, "L"))
    put("jpeg", "progressive", jpeg(20, 20, progressive=True))
    # TFRecord: ImageNet-style examples, and an empty file
    rec = example({"image/encoded": ("bytes", [jpeg(8, 8)]), "image/class/label": ("int64", [7])})
    put("tfrecord", "imagenet", tfrecord([rec, rec]))
    put("tfrecord", "translation", tfrecord([example({"inputs": ("int64", [5, 9, 1]),
                                                       "targets": ("int64", [6, 1])})]))
    put("tfrecord", "empty", b"")
    # Vocabulary files: quoted, escaped subtokens (with the reserved ones, escapes \\u and
    # \\\\, and a non-ASCII subtoken), and a small one without the escape characters
    put("vocab", "vocab", "'<pad>'\n'<EOS>'\n'the_'\n'Haus_'\n'\\u_'\n'\\\\'\n'ü'\n"
        + "".join(f"'{c}'\n" for c in "abcdefghijklmnopqrstuvwxyzH_\\u;0123456789 .,"))
    put("vocab", "tiny", "'a'\n'b_'\n")
    # BLEU input: lines of a reference or translation file
    put("bleu", "text", "Das Haus ist klein.\nThe house is small , isn't it?\n"
        "Gutach: Noch mehr Sicherheit für Fußgänger\n\n1 , 000 Euro ( 3 %)\n")
    csv_seeds()
    more_seeds()


def more_seeds():
    # Seeds added after the first 10-minute runs, for the paths the first ones left out
    # (none of them needs PIL, so `make_seeds.py more` writes only these).
    # BLEU: every line boundary str.splitlines() knows, symbols and punctuation classes,
    # non-Latin scripts, numbers with separators, lines of 4 tokens or more (the target's
    # "exactly 100" check), leading and trailing blank space that strip() removes.
    put("bleu", "boundaries", "eins zwei drei vier\r\nfive six seven eight\rneun\x0bzehn\x0celf\x1czwölf\x1d"
        "a\x1eb\u0085c\u2028d\u2029e\n")
    put("bleu", "symbols", "€5 + 3$ = 8 ± 1 ; «Zitat» — „so“ (ok) [1] {2} <3> 100% #tag @me ^_^ ~x~ `q` |p|\n"
        "1,000.5 3.14 -2 +7 1e-3 2:30 4/5\n")
    put("bleu", "scripts", "\u3000  東京は大きい。 Москва — столица. Αθήνα! مرحبا؟ שלום. 안녕하세요?\n\t \n")
    put("bleu", "long", "".join(f"line {i} has four tokens at least , really .\n" for i in range(40)))
    put("bleu", "case", "The THE the ThE\nÉTÉ été Été\nİstanbul ISTANBUL ß SS\n")
    # Vocabularies: numeric escapes (\<code>;), escaped underscores and backslashes, long
    # subtokens, duplicates, CRLF line ends, a line without quotes.
    put("vocab", "numeric", "'<pad>'\n'<EOS>'\n'\\233;_'\n'\\65;\\66;'\n'a\\u'\n'\\\\_'\n'Straße_'\n'_'\n"
        + "".join(f"'{c}'\n" for c in "abcdeST_\\u;0123456789"))
    put("vocab", "long", "'<pad>'\n'<EOS>'\n" + "".join(f"'{w}_'\n" for w in
        ("internationalisation", "Sicherheitsmaßnahmen", "the", "the", "Haus", "house")) +
        "".join(f"'{c}'\n" for c in "abcdefghijklmnopqrstuvwxyzäöüßHST_\\u;0123456789 "))
    put("vocab", "crlf", "'<pad>'\r\n'<EOS>'\r\n'x_'\r\nunquoted\r\n'y'\r\n")
    # TFRecord: a float list, several features of every kind, unpacked int64s, a bad CRC,
    # a record cut short, and an empty record.
    rich = example({"image/encoded": ("bytes", [b"\xff\xd8\xff\xd9"]), "image/class/label": ("int64", [1]),
                    "image/height": ("int64", [8]), "image/format": ("bytes", [b"JPEG"]),
                    "targets": ("int64", [3, 1 << 40, 1])})
    put("tfrecord", "features", tfrecord([rich, example({"inputs": ("int64", [])})]))
    good = tfrecord([rich])
    put("tfrecord", "bad-crc", good[:-1] + bytes([good[-1] ^ 1]))
    put("tfrecord", "cut-short", good[: len(good) // 2])
    put("tfrecord", "empty-record", tfrecord([b""]))
    # IDX: i32 and f64 elements, three dimensions, a header claiming more than the file holds.
    put("idx", "i32-3d", struct.pack(">I", 0x0C03) + struct.pack(">III", 2, 1, 2) + struct.pack(">4i", 1, -1, 7, 0))
    put("idx", "f64", struct.pack(">I", 0x0E01) + struct.pack(">I", 2) + struct.pack(">2d", 0.25, -8))
    put("idx", "short", struct.pack(">I", 0x0803) + struct.pack(">III", 1000, 28, 28) + bytes(50))
    # SLURM: leading zeros of different widths, nested-looking brackets, counts with (xN).
    put("slurm", "widths", "n[8-12],m[098-101],k7\n3(x2),1")
    put("slurm", "singles", "a[1],b[2,4],c\n1,1,1,1")
    # CSV: the first byte is fuzz_csv's option bits, the rest the file.
    put("csv", "header", b"\x00" + b"x,y,z\n1,0,2.5\n-3.25,1,4\n")
    put("csv", "quoted-crlf", b"\x20" + b'# comment\r\n"x","y"\r\n"1,5",2\r\n\r\n"a ""q""\r\nb",3\r\n')
    put("csv", "no-header-f32", b"\x0b" + b"0.5,1,2\n1.5,3,4\n")
    put("csv", "semicolon", b"\x10" + b"x;y\n 1 ; 2\n+3;-4\n")
    put("csv", "bad-label", b"\x00" + b"x,y\n1,2147483648\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["more"]:
        sys.exit(more_seeds())
    sys.exit(main())
