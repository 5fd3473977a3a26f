//! Hostile npz archives, each written by Python (zipfile, numpy) and
//! patched where the lie needs it, through `formats::open`, the data layer
//! and a real mount, each held to its exact outcome ([`Want`]): refused in
//! one line naming the file, the member and the problem; the member listed
//! with its reason; reading it failing (EIO) because a check failed; or
//! served with the bytes `np.load` gives. What numpy itself does with each
//! file is asserted too ([`Reader`]), so the table says where the mount is
//! stricter than numpy and why. Never a panic or a hang (the harness kills
//! a mount that takes over 20 s).
//!
//! The interpreter is `$ZT_PYTHON` (default `.venv/bin/python3`) with
//! numpy. Without it, or without FUSE, the test prints a note and passes,
//! except under `CI=true`, where it fails.

mod support;

use support::hostile::{Reader, Want, run_cases};
use support::python::Python;

/// Writes each case as `DIR/<i>.npz` and `DIR/cases.json`: for each, what
/// `np.load` made of it (an error, or each member's little-endian bytes
/// or error).
const WRITE: &str = r#"
import io, json, os, struct, sys, zipfile, zlib
import numpy as np

def npy_bytes(arr):
    b = io.BytesIO(); np.save(b, arr); return b.getvalue()

def npy(descr, shape, data, version=1, fortran=False, pad_to=64, extra=""):
    h = "{'descr': %s, 'fortran_order': %s, 'shape': %s, %s}" % (descr, fortran, shape, extra)
    pre = 10 if version == 1 else 12
    h = h + " " * ((pad_to - 1 - (pre + len(h)) % pad_to) % pad_to) + "\n"
    hb = h.encode("utf8")
    ln = len(hb).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + ln + hb + data

def zipped(members, method=zipfile.ZIP_STORED):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        for name, data in members:
            z.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data, compress_type=method)
    return bytearray(b.getvalue())

def eocd(b):
    return b.rfind(b"PK\x05\x06")

def central(b, i=0):
    e = eocd(b)
    off = struct.unpack_from("<I", b, e + 16)[0]
    for _ in range(i):
        nl, xl, cl = struct.unpack_from("<HHH", b, off + 28)
        off += 46 + nl + xl + cl
    return off

def local(b, i=0):
    return struct.unpack_from("<I", b, central(b, i) + 42)[0]

A = np.arange(6, dtype="<f4")
GOOD = ("good.npy", npy_bytes(np.array([7, 8, 9], dtype="<i2")))

def raw_deflate(data):
    c = zlib.compressobj(9, zlib.DEFLATED, -15); return c.compress(data) + c.flush()

def member_zip(name, size, crc, comp, method=8):
    # one hand-made member with the declared size/crc, then GOOD stored
    nb = name.encode()
    lh = struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, 0, method, 0, 0x21, crc, len(comp), size, len(nb), 0) + nb + comp
    ch = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 20, 20, 0, method, 0, 0x21, crc, len(comp), size, len(nb), 0, 0, 0, 0, 0, 0) + nb
    g = zipped([GOOD])
    gl = g[:central(g)]  # GOOD's local header + data
    gc = g[central(g):eocd(g)]
    gc = bytearray(gc); struct.pack_into("<I", gc, 42, len(lh))
    body = lh + bytes(gl)
    cd = ch + bytes(gc)
    end = struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 2, 2, len(cd), len(body), 0)
    return bytearray(body + cd + end)

cases = {}
def case(what, b):
    cases[what] = bytes(b)

case("empty archive", zipped([]))
b = zipped([("a.npy", npy_bytes(A)), GOOD]); case("truncated file", b[: len(b) // 2])
b = zipped([("a.npy", npy_bytes(A))]); e = eocd(b); struct.pack_into("<HH", b, e + 8, 2, 2); case("directory entry count lies", b)
b = zipped([("a.npy", npy_bytes(A)), GOOD]); e = eocd(b); struct.pack_into("<I", b, e + 16, 3); case("directory offset lies", b)
b = zipped([("a.npy", npy_bytes(A)), GOOD]); l = local(b); b[l + 30] = ord("z"); case("local header name differs", b)
b = zipped([("a.npy", npy_bytes(A)), GOOD]); struct.pack_into("<I", b, central(b, 1) + 42, local(b, 0)); case("local header offset aims at another member", b)
b = zipped([("a.npy", npy_bytes(A)), GOOD]); l = local(b); struct.pack_into("<II", b, l + 18, 5, 5); case("local header sizes lie", b)
b = zipped([("a.npy", npy_bytes(A)), GOOD]); c = central(b); struct.pack_into("<II", b, c + 20, 1 << 30, 1 << 30); case("member runs past the file", b)
# ZIP64: central sizes 0xFFFFFFFF with a zip64 extra giving 2^62.
b = zipped([("a.npy", npy_bytes(A))]); c = central(b)
nl, xl, cl = struct.unpack_from("<HHH", b, c + 28)
extra = struct.pack("<HHQQ", 1, 16, 1 << 62, 1 << 62)
struct.pack_into("<IIH", b, c + 20, 0xFFFFFFFF, 0xFFFFFFFF, nl); struct.pack_into("<H", b, c + 30, len(extra))
ins = c + 46 + nl
b = b[:ins] + extra + b[ins:]
e = eocd(b); struct.pack_into("<I", b, e + 12, struct.unpack_from("<I", b, e + 12)[0] + len(extra)); case("ZIP64 sizes lie", b)
# Bomb: declares 2 GiB, inflates to a few bytes.
hdr = npy("'|u1'", "(%d,)" % ((1 << 31) - 128), b"")
assert len(hdr) == 128
comp = raw_deflate(hdr + b"\0" * 1000)
case("deflate bomb declared 2 GiB", member_zip("bomb.npy", 1 << 31, zlib.crc32(hdr + b"\0" * 1000), comp))
# Inflates to more than declared: declared 128+12, inflates 128+12+4096 (CRC of all).
full = npy("'<f4'", "(3,)", b"\1" * (12 + 4096))
comp = raw_deflate(full)
case("deflated member inflates more than declared", member_zip("more.npy", len(full) - 4096, zlib.crc32(full), comp))
d = npy_bytes(A); case("deflated member CRC mismatch", member_zip("a.npy", len(d), zlib.crc32(d) ^ 1, raw_deflate(d)))
d = npy_bytes(A); case("stored member CRC mismatch", member_zip("a.npy", len(d), zlib.crc32(d) ^ 1, d, method=0))
B = np.array([0, 1, 2, 255], dtype=np.uint8).view(np.bool_)
case("bool byte 2, stored", zipped([("b.npy", npy_bytes(B)), GOOD]))
case("bool byte 2, deflated", zipped([("b.npy", npy_bytes(B)), GOOD], method=zipfile.ZIP_DEFLATED))
case("npy data shorter than its shape", zipped([("a.npy", npy("'<f4'", "(3,)", b"\0" * 8)), GOOD]))
case("npy data longer than its shape", zipped([("a.npy", npy("'<f4'", "(3,)", b"\0" * 16)), GOOD]))
case("negative dimension", zipped([("a.npy", npy("'<f4'", "(-1,)", b"\0" * 4)), GOOD]))
case("shape product overflows", zipped([("a.npy", npy("'<f4'", "(4294967296, 4294967296, 16)", b"\0" * 4)), GOOD]))
case("object descr", zipped([("a.npy", npy("'|O'", "(1,)", b"\0" * 8)), GOOD]))
case("unknown descr", zipped([("a.npy", npy("'<q7'", "(1,)", b"\0" * 8)), GOOD]))
case("fortran_order True", zipped([("a.npy", npy_bytes(np.asfortranarray(A.reshape(2, 3)))), GOOD]))
h = bytearray(npy("'<f4'", "(6,)", A.tobytes())); struct.pack_into("<H", h, 8, 60000)
case("header length past the member", zipped([("a.npy", bytes(h)), GOOD]))
case("header longer than 4 KiB", zipped([("a.npy", npy("'<f4'", "(6,)", A.tobytes(), pad_to=8192)), GOOD]))
h3 = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), } # \u00e9t\u00e9"
h3 = h3 + " " * (63 - (12 + len(h3.encode())) % 64) + "\n"
case("version 3 header in UTF-8", zipped([("a.npy", b"\x93NUMPY\x03\x00" + len(h3.encode()).to_bytes(4, "little") + h3.encode() + A.tobytes()), GOOD]))
h = bytearray(npy("'<f4'", "(6,)", A.tobytes())); h[6] = 9
case("npy version 9", zipped([("a.npy", bytes(h)), GOOD]))
case("member not .npy inside", zipped([("a.npy", b"just some text, not an array"), GOOD]))
case("name with a slash", zipped([("d/a.npy", npy_bytes(A)), GOOD]))
case("name with dot-dot", zipped([("../../a.npy", npy_bytes(A)), GOOD]))
case("name with a NUL", zipped([("a\0b.npy", npy_bytes(A)), GOOD]))
b = zipped([("a.npy", npy_bytes(A)), ("b.npy", npy_bytes(A[:2]))])
l1 = local(b, 1); c1 = central(b, 1); b[l1 + 30] = ord("a"); b[c1 + 46] = ord("a")
case("duplicate member names", b)
b = zipped([("a.npy", npy_bytes(A)), GOOD]); struct.pack_into("<H", b, local(b) + 6, 1); struct.pack_into("<H", b, central(b) + 8, 1)
case("encrypted member", b)
case("other members beside", zipped([("readme.txt", b"hello"), ("a.npy", npy_bytes(A)), GOOD]))
case("bzip2 member", zipped([("a.npy", npy_bytes(A)), ], method=zipfile.ZIP_BZIP2) )

out = sys.argv[1]
names = []
for i, (what, data) in enumerate(cases.items()):
    p = os.path.join(out, "%d.npz" % i)
    open(p, "wb").write(data)
    res = {}
    try:
        z = np.load(p, allow_pickle=False)
        for k in z.files:
            try:
                a = z[k]
                if isinstance(a, np.ndarray):
                    le = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"))
                    res[k] = {"hex": le.tobytes().hex()}
                else:
                    res[k] = {"error": "not an array"}
            except Exception as ex:
                res[k] = {"error": "%s: %s" % (type(ex).__name__, ex)}
        r = {"members": res}
    except Exception as ex:
        r = {"error": "%s: %s" % (type(ex).__name__, ex)}
    names.append({"what": what, "file": p, "numpy": r})
json.dump(names, open(os.path.join(out, "cases.json"), "w"), indent=1)
print("OK")
"#;

/// Each case's outcome here, and what `np.load(f, allow_pickle=False)`
/// does with it.
fn want(what: &str) -> (Want, Reader) {
    use Reader::*;
    use Want::*;
    match what {
        "empty archive" => (Served, Reads),
        "truncated file" => (
            Refused("a ZIP archive (npz or PyTorch .pt) that cannot be read, cut short or damaged"),
            Refuses("File is not a zip file"),
        ),
        "directory entry count lies" => (Refused("ZIP"), Reads),
        // Python's zipfile takes the difference for bytes prepended to the
        // archive, and every member's local header is then missed.
        "directory offset lies" => (Refused("ZIP"), AllFail("BadZipFile")),
        "local header name differs" => (
            Refused("\"a\": its local header names \"z.npy\""),
            Fails(
                "a",
                "File name in directory 'a.npy' and header b'z.npy' differ",
            ),
        ),
        "local header offset aims at another member" => (
            Refused("\"good\": its local header names \"a.npy\""),
            Fails(
                "good",
                "File name in directory 'good.npy' and header b'a.npy' differ",
            ),
        ),
        // Sizes come from the central directory, as numpy takes them.
        "local header sizes lie" => (Served, Reads),
        // numpy reads the member's first bytes and stops before the end.
        "member runs past the file" => (
            Refused("\"a\": its member's 1073741824 bytes at 35 run past the end of the file"),
            Reads,
        ),
        "ZIP64 sizes lie" => (
            Refused("\"a\": its member's 4611686018427387904 bytes at 35 run past the end"),
            Reads,
        ),
        "deflate bomb declared 2 GiB" => (
            Listed("bomb", "over the 1073741824-byte limit"),
            Fails(
                "bomb",
                "EOF: reading array data, expected 262144 bytes got 1000",
            ),
        ),
        "deflated member inflates more than declared" => (
            Eio("more", "inflates to more than the 140 bytes it declares"),
            Fails("more", "Bad CRC-32 for file 'more.npy'"),
        ),
        "deflated member CRC mismatch" => (
            Eio("a", "CRC-32"),
            Fails("a", "Bad CRC-32 for file 'a.npy'"),
        ),
        "stored member CRC mismatch" => (
            Eio(
                "a",
                "checksum mismatch over the stored bytes: the file says crc32:0x",
            ),
            Fails("a", "Bad CRC-32 for file 'a.npy'"),
        ),
        // numpy hands the bytes back as they are; a bool is 0 or 1.
        "bool byte 2, stored" | "bool byte 2, deflated" => (
            Eio("b", "tensor \"b\": bool element 2 is neither 0 nor 1"),
            Reads,
        ),
        "npy data shorter than its shape" => (
            Refused("\"a\": holds 8 bytes of data but <f4 of shape [3] is 12"),
            Fails("a", "expected 12 bytes got 8"),
        ),
        // numpy reads what the shape needs and leaves the rest unread.
        "npy data longer than its shape" => (
            Refused("\"a\": holds 16 bytes of data but <f4 of shape [3] is 12"),
            Reads,
        ),
        "negative dimension" => (
            Refused("\"a\": a dimension of its shape is negative"),
            Fails("a", "negative dimensions are not allowed"),
        ),
        "shape product overflows" => (
            Refused(
                "\"a\": holds 4 bytes of data but <f4 of shape [4294967296, 4294967296, 16] is more than 2^64",
            ),
            Fails("a", "cannot reshape array of size 0"),
        ),
        "object descr" => (
            Listed("a", "\"|O\" has no element type"),
            Fails(
                "a",
                "Object arrays cannot be loaded when allow_pickle=False",
            ),
        ),
        "unknown descr" => (
            Listed("a", "\"<q7\" has no element type"),
            Fails("a", "descr is not a valid dtype descriptor: '<q7'"),
        ),
        // numpy transposes on read; the mount does not serve it transposed.
        "fortran_order True" => (Listed("a", "Fortran"), Reads),
        "header length past the member" => (
            Refused("\"a\": its .npy header of 60010 bytes runs past"),
            Fails("a", "expected 60000 bytes got 142"),
        ),
        "header longer than 4 KiB" => (Served, Reads),
        "version 3 header in UTF-8" => (Served, Reads),
        "npy version 9" => (
            Refused("\"a\": .npy format version 9 is not read"),
            Fails("a", "not (9, 0)"),
        ),
        // numpy hands back the bytes of a member that is not an array.
        "member not .npy inside" => (
            Refused("\"a\": not a .npy member"),
            Fails("a", "not an array"),
        ),
        "name with a slash" => (Served, Reads),
        "name with dot-dot" => (Served, Reads),
        // Python's zipfile and the zip crate both cut a name at a NUL: the
        // member is "a", an array by its magic.
        "name with a NUL" => (Served, Reads),
        // Python's zipfile and the zip crate both keep the last of the two.
        "duplicate member names" => (Served, Reads),
        "encrypted member" => (
            Refused("\"a\": its member is encrypted, which is not read here"),
            Fails("a", "is encrypted, password required"),
        ),
        "other members beside" => (Served, Fails("readme.txt", "not an array")),
        // Python's zipfile inflates bzip2 too; only deflate is read here.
        "bzip2 member" => (Refused("\"a\": its member is compressed with"), Reads),
        other => panic!("no expected outcome for the case {other:?}"),
    }
}

fn python() -> Option<Python> {
    Python::from_env().require(
        "Python with numpy (scripts/setup.sh)",
        "import numpy",
        |_| Ok(()),
    )
}

#[test]
fn hostile_npz() {
    let Some(py) = python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    py.run_ok(
        &["-c".as_ref(), WRITE.as_ref(), dir.path().as_os_str()],
        std::time::Duration::from_secs(60),
        "writing the npz cases",
    );
    let cases = support::python::read_json(&dir.path().join("cases.json"));
    run_cases(&cases, "numpy", want);
}
