//! Hostile ONNX models, each written by Python with the `onnx` package
//! (`helper`, `numpy_helper`, protobuf messages set field by field) or as
//! raw protobuf bytes where the lie is in the wire format, through
//! `formats::open`, the data layer and a real mount, each held to its
//! exact outcome ([`Want`]): refused in one line naming the file, the
//! tensor and the problem; the tensor listed with its reason; or served
//! with the bytes `onnx.numpy_helper.to_array` gives. What `onnx.load` and
//! `to_array` do with each model is asserted too ([`Reader`]), so the
//! table says where the mount is stricter and why. External data is read
//! from the model's directory only. Never a panic or a hang (the harness
//! kills a mount that takes over 20 s).
//!
//! The interpreter is `$ZT_PYTHON` (default `.venv/bin/python3`) with
//! numpy and onnx. Without them, or without FUSE, the test prints a note
//! and passes, except under `CI=true`, where it fails.

mod support;

use support::hostile::{Reader, Want, run_cases};
use support::python::Python;

/// Writes each case as `DIR/<i>/model.onnx` (with any external data file
/// beside it) and `DIR/cases.json`: for each, what `onnx.load` and
/// `numpy_helper.to_array` made of it.
const WRITE: &str = r#"
import json, os, sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

out = sys.argv[1]
cases = []

def model(inits, sparse=()):
    g = helper.make_graph([], "g", [], [], initializer=inits, sparse_initializer=list(sparse))
    return helper.make_model(g)

def raw(name, dtype, dims, data):
    t = TensorProto(); t.name = name; t.data_type = dtype; t.dims.extend(dims); t.raw_data = data
    return t

GOOD = numpy_helper.from_array(np.array([7, 8, 9], dtype=np.int16), "good")
A = np.arange(6, dtype=np.float32).reshape(2, 3)

def case(what, m=None, raw_bytes=None, files=()):
    i = len(cases)
    d = os.path.join(out, str(i))
    os.makedirs(d)
    p = os.path.join(d, "model.onnx")
    if raw_bytes is None:
        raw_bytes = m.SerializeToString()
    open(p, "wb").write(raw_bytes)
    for name, data in files:
        fp = os.path.join(d, name)
        os.makedirs(os.path.dirname(fp), exist_ok=True)
        open(fp, "wb").write(data)
    cases.append((what, p))

def ext(name, dtype, dims, location, offset=None, length=None):
    t = TensorProto(); t.name = name; t.data_type = dtype; t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = t.external_data.add(); e.key = k; e.value = str(v)
    return t

def varint(n):
    b = bytearray()
    while True:
        x = n & 0x7F; n >>= 7
        if n: b.append(x | 0x80)
        else: b.append(x); return bytes(b)

def field(num, wire, payload):
    if wire == 2:
        return varint(num << 3 | 2) + varint(len(payload)) + payload
    return varint(num << 3 | wire) + payload

case("served as written", model([numpy_helper.from_array(A, "a"), GOOD]))
case("raw_data shorter than its dims", model([raw("a", TensorProto.FLOAT, [3], b"\0" * 8), GOOD]))
case("raw_data longer than its dims", model([raw("a", TensorProto.FLOAT, [3], b"\0" * 16), GOOD]))
case("negative dimension", model([raw("a", TensorProto.FLOAT, [-1], b"\0" * 4), GOOD]))
case("negative dimension beside a zero", model([raw("a", TensorProto.FLOAT, [-1, 0], b""), GOOD]))
case("dims product overflows", model([raw("a", TensorProto.FLOAT, [1 << 32, 1 << 32, 16], b"\0" * 4), GOOD]))
case("unknown data_type", model([raw("a", 99, [2], b"\0" * 2), GOOD]))
case("undefined data_type", model([raw("a", 0, [2], b"\0" * 2), GOOD]))
case("string tensor", model([numpy_helper.from_array(np.array([b"x", b"yz"], dtype=object), "a"), GOOD]))
t = TensorProto(); t.name = "a"; t.data_type = TensorProto.FLOAT; t.dims.extend([3]); t.float_data.extend([1.0, 2.0])
case("float_data count wrong", model([t, GOOD]))
t = TensorProto(); t.name = "a"; t.data_type = TensorProto.INT64; t.dims.extend([2]); t.int64_data.extend([5, -6, 7])
case("int64_data count wrong", model([t, GOOD]))
t = TensorProto(); t.name = "a"; t.data_type = TensorProto.FLOAT16; t.dims.extend([2]); t.int32_data.extend([0x3C00, 0xC000])
t2 = TensorProto(); t2.name = "b"; t2.data_type = TensorProto.INT64; t2.dims.extend([2]); t2.int64_data.extend([5, -6])
case("typed fields served", model([t, t2, GOOD]))
t = raw("a", TensorProto.FLOAT, [2], np.array([1, 2], np.float32).tobytes()); t.float_data.extend([3.0, 4.0])
case("raw_data and float_data both", model([t, GOOD]))
case("external data fine", model([ext("a", TensorProto.FLOAT, [2, 3], "w.bin", 8, 24), GOOD]),
     files=[("w.bin", b"\xAA" * 8 + A.tobytes())])
case("external path escapes the directory", model([ext("a", TensorProto.FLOAT, [2], "../../etc/passwd"), GOOD]))
case("external path absolute", model([ext("a", TensorProto.FLOAT, [2], "/etc/passwd"), GOOD]))
case("external range past its file", model([ext("a", TensorProto.FLOAT, [2, 3], "w.bin", 16, 24), GOOD]),
     files=[("w.bin", A.tobytes())])
case("external file missing", model([ext("a", TensorProto.FLOAT, [2], "nothere.bin"), GOOD]))
case("duplicate initializer names", model([numpy_helper.from_array(A, "a"), numpy_helper.from_array(A[0], "a")]))
case("name with a NUL", model([numpy_helper.from_array(A, "a\0b"), GOOD]))
case("name with a slash", model([numpy_helper.from_array(A, "d/a"), GOOD]))
case("name with dot-dot", model([numpy_helper.from_array(A, "../../a"), GOOD]))
t = numpy_helper.from_array(A, "a"); t.segment.begin = 0; t.segment.end = 3
case("a segment of a tensor", model([t, GOOD]))
sp = helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0], np.float32), "sp"),
                               numpy_helper.from_array(np.array([1], np.int64), "sp_i"), [4])
case("sparse initializer", model([GOOD], sparse=[sp]))
good = model([numpy_helper.from_array(A, "a"), GOOD]).SerializeToString()
case("truncated protobuf", raw_bytes=good[: len(good) - 10])
case("varint runs past the end", raw_bytes=good + b"\x08\xff")
# An initializer whose length says more than its graph holds.
tb = raw("a", TensorProto.FLOAT, [2], b"\0" * 8).SerializeToString()
graph = field(5, 2, tb)
graph = graph[:1] + varint(len(tb) + 50) + graph[1 + len(varint(len(tb))):]
case("nested length lies", raw_bytes=field(1, 0, varint(8)) + field(7, 2, graph))
# raw_data whose length varint says 2^62 bytes.
tb = field(8, 2, b"a") + field(2, 0, varint(1)) + field(1, 0, varint(2)) + varint(9 << 3 | 2) + varint(1 << 62) + b"\0" * 8
case("huge declared length", raw_bytes=field(1, 0, varint(8)) + field(7, 2, field(5, 2, tb)))

res = []
for what, p in cases:
    try:
        m = onnx.load(p)
        r = {}
        for t in m.graph.initializer:
            try:
                a = numpy_helper.to_array(t, base_dir=os.path.dirname(p)) if t.data_location == TensorProto.EXTERNAL else numpy_helper.to_array(t)
                if a.dtype == object:
                    r[t.name] = {"error": "an object array"}
                else:
                    r[t.name] = {"hex": np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes().hex()}
            except Exception as ex:
                r[t.name] = {"error": "%s: %s" % (type(ex).__name__, ex)}
        for s in m.graph.sparse_initializer:
            r[s.values.name] = {"error": "a sparse initializer"}
        o = {"members": r}
    except Exception as ex:
        o = {"error": "%s: %s" % (type(ex).__name__, str(ex).replace("\n", " "))}
    res.append({"what": what, "file": p, "onnx": o})
json.dump(res, open(os.path.join(out, "cases.json"), "w"), indent=1)
print("OK")
"#;

/// Each case's outcome here, and what `onnx.load` + `to_array` do with it.
fn want(what: &str) -> (Want, Reader) {
    use Reader::*;
    use Want::*;
    match what {
        "served as written" => (Served, Reads),
        "raw_data shorter than its dims" => (
            Refused("tensor \"a\": holds 8 bytes in raw_data but FLOAT of dims [3] is 12"),
            Fails("a", "cannot reshape array of size 2 into shape (3,)"),
        ),
        "raw_data longer than its dims" => (
            Refused("tensor \"a\": holds 16 bytes in raw_data but FLOAT of dims [3] is 12"),
            Fails("a", "cannot reshape array of size 4 into shape (3,)"),
        ),
        // numpy's reshape takes -1 as "whatever is left"; ONNX dims are
        // never negative.
        "negative dimension" => (
            Refused("tensor \"a\": dimension -1 of its dims [-1] is negative"),
            Reads,
        ),
        "negative dimension beside a zero" => (
            Refused("tensor \"a\": dimension -1 of its dims [-1, 0] is negative"),
            Fails("a", "cannot reshape array of size 0"),
        ),
        "dims product overflows" => (
            Refused(
                "tensor \"a\": FLOAT of dims [4294967296, 4294967296, 16] is more than 2^64 bytes",
            ),
            Fails("a", "cannot reshape array of size 1"),
        ),
        "unknown data_type" => (
            Listed("a", "ONNX data type 99 is not one this reader knows"),
            Fails("a", "KeyError: 99"),
        ),
        "undefined data_type" => (
            Listed("a", "its data_type is 0 (UNDEFINED)"),
            Fails("a", "UNDEFINED"),
        ),
        "string tensor" => (
            Listed("a", "a STRING tensor: strings have no element type here"),
            Fails("a", "an object array"),
        ),
        "float_data count wrong" => (
            Refused("tensor \"a\": holds 8 bytes in float_data but FLOAT of dims [3] is 12"),
            Fails("a", "cannot reshape array of size 2 into shape (3,)"),
        ),
        "int64_data count wrong" => (
            Refused("tensor \"a\": holds 24 bytes in int64_data but INT64 of dims [2] is 16"),
            Fails("a", "cannot reshape array of size 3 into shape (2,)"),
        ),
        "typed fields served" => (Served, Reads),
        // to_array takes raw_data and ignores float_data; ONNX allows one.
        "raw_data and float_data both" => (
            Refused("tensor \"a\": its data is in more than one place (raw_data, float_data)"),
            Reads,
        ),
        "external data fine" => (Served, Reads),
        "external path escapes the directory" => (
            Refused(
                "tensor \"a\": its external data file \"../../etc/passwd\" is not a plain path \
                 inside the model's directory",
            ),
            Refuses("'../../etc/passwd' points outside the directory"),
        ),
        "external path absolute" => (
            Refused("tensor \"a\": its external data file \"/etc/passwd\" is an absolute path"),
            Refuses("should be a relative path, but it is an absolute path: /etc/passwd"),
        ),
        "external range past its file" => (
            Refused(
                "tensor \"a\": its external bytes at 16 (+24) run past the end of \"w.bin\" (24 bytes)",
            ),
            Refuses("External data length (24) exceeds available data (8 bytes from offset 16)"),
        ),
        "external file missing" => (
            Refused(
                "tensor \"a\": its external data file \"nothere.bin\" cannot be opened: No such file",
            ),
            Refuses("but it is not regular file"),
        ),
        // to_array reads each; the mount cannot serve two files of one name.
        "duplicate initializer names" => (
            Refused("tensor \"a\": two initializers of this name"),
            Reads,
        ),
        "name with a NUL" => (Served, Reads),
        "name with a slash" => (Served, Reads),
        "name with dot-dot" => (Served, Reads),
        "a segment of a tensor" => (
            Listed("a", "a segment of a tensor (TensorProto.segment)"),
            Fails("a", "Currently not supporting loading segments"),
        ),
        "sparse initializer" => (
            Listed("sp", "a sparse initializer (SparseTensorProto)"),
            Fails("sp", "a sparse initializer"),
        ),
        "truncated protobuf" => (
            Refused(
                "ONNX model: a length of 60 bytes at byte 4 runs past the end of the model (54 bytes left)",
            ),
            Refuses("Error parsing message with type 'onnx.ModelProto'"),
        ),
        "varint runs past the end" => (
            Refused("ONNX model: a varint at byte 69 runs past the end of the model"),
            Refuses("Error parsing message with type 'onnx.ModelProto'"),
        ),
        "nested length lies" => (
            Refused(
                "ONNX graph: a length of 67 bytes at byte 6 runs past the end of the graph (17 bytes left)",
            ),
            Refuses("Error parsing message with type 'onnx.ModelProto'"),
        ),
        "huge declared length" => (
            Refused(
                "ONNX initializer at byte 6: a length of 4611686018427387904 bytes at byte 23 runs \
                 past the end of an initializer (8 bytes left)",
            ),
            Refuses("Error parsing message with type 'onnx.ModelProto'"),
        ),
        other => panic!("no expected outcome for the case {other:?}"),
    }
}

#[test]
fn hostile_onnx() {
    let Some(py) = Python::from_env().require(
        "Python with numpy and onnx (scripts/setup.sh)",
        "import numpy, onnx",
        |_| Ok(()),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    py.run_ok(
        &["-c".as_ref(), WRITE.as_ref(), dir.path().as_os_str()],
        std::time::Duration::from_secs(60),
        "writing the ONNX cases",
    );
    let cases = support::python::read_json(&dir.path().join("cases.json"));
    run_cases(&cases, "onnx", want);
}
