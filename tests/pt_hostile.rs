//! Hostile PyTorch `.pt` files, each forged from a fixture torch wrote
//! (`tests/fixtures/pt/`) by editing its bytes in place or rebuilding the
//! archive with a changed `data.pkl` or storage member: a lying or cut zip,
//! a malformed or malicious pickle, tensors that do not fit their storages.
//! Each must be refused at open in one line naming the file, or open with
//! the bad tensor listed as unsupported (with its reason) or failing its
//! reads, every other tensor reading torch's bytes. Never a panic, a hang
//! or code run. A handful go through a real mount too; then cut and
//! byte-flipped variants of every fixture must not panic.

mod support;

use std::path::{Path, PathBuf};

use support::Mount;
use support::data::{read_whole, serve, tensor_index};
use ztensor_mount::formats::{self, Limits};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt")
}

/// What torch holds for tensor `name` of fixture `file` (C order).
fn expected(file: &str, name: &str) -> Vec<u8> {
    let stem = file.trim_end_matches(".pt");
    std::fs::read(fixtures().join(stem).join(format!("{name}.bin")))
        .unwrap_or_else(|e| panic!("{stem}/{name}.bin: {e}"))
}

// ---------------------------------------------------------------- forging

/// The members of an archive, in order: (name, bytes).
type Members = Vec<(String, Vec<u8>)>;

fn members(file: &str) -> Members {
    let bytes = std::fs::read(fixtures().join(file)).unwrap();
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..zip.len())
        .map(|i| {
            let mut f = zip.by_index(i).unwrap();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut data).unwrap();
            (f.name().to_string(), data)
        })
        .collect()
}

/// An archive of `members` laid out as torch lays it (stored, 64-byte
/// aligned), the members named in `deflate` deflated.
fn archive(members: &Members, deflate: &[&str]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in members {
        let method = if deflate.contains(&name.as_str()) {
            zip::CompressionMethod::Deflated
        } else {
            zip::CompressionMethod::Stored
        };
        let opts = SimpleFileOptions::default()
            .compression_method(method)
            .with_alignment(64);
        w.start_file(name.as_str(), opts).unwrap();
        std::io::Write::write_all(&mut w, data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

fn member<'a>(m: &'a mut Members, name: &str) -> &'a mut Vec<u8> {
    m.iter_mut()
        .find(|(n, _)| n == name)
        .map(|(_, d)| d)
        .unwrap_or_else(|| panic!("no member {name}"))
}

fn find(b: &[u8], pat: &[u8]) -> usize {
    b.windows(pat.len())
        .position(|w| w == pat)
        .unwrap_or_else(|| panic!("pattern {pat:?} not found"))
}

/// Replaces the one occurrence of `from` in `b` with `to`.
fn replace(b: &mut Vec<u8>, from: &[u8], to: &[u8]) {
    let at = find(b, from);
    assert!(
        b[at + 1..].windows(from.len()).all(|w| w != from),
        "pattern {from:?} is not unique"
    );
    b.splice(at..at + from.len(), to.iter().copied());
}

/// A pickle BINUNICODE of `s`.
fn text(s: &[u8]) -> Vec<u8> {
    let mut v = vec![b'X'];
    v.extend_from_slice(&(s.len() as u32).to_le_bytes());
    v.extend_from_slice(s);
    v
}

/// A pickle LONG1 of `n`.
fn long(n: i64) -> Vec<u8> {
    let mut v = vec![0x8a, 8];
    v.extend_from_slice(&n.to_le_bytes());
    v
}

/// A pickle BININT of `n`.
fn int(n: i32) -> Vec<u8> {
    let mut v = vec![b'J'];
    v.extend_from_slice(&n.to_le_bytes());
    v
}

/// `file` rebuilt with its members changed by `f`.
fn rebuilt(file: &str, f: impl Fn(&mut Members)) -> Vec<u8> {
    let mut m = members(file);
    f(&mut m);
    archive(&m, &[])
}

/// `file` rebuilt with its `data.pkl` changed by `f`.
fn repickled(file: &str, f: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let stem = file.trim_end_matches(".pt").to_string();
    rebuilt(file, move |m| f(member(m, &format!("{stem}/data.pkl"))))
}

/// `pickle` (shared.pt's or strided.pt's: one dict, one SETITEMS) with one
/// more key `key` whose value the opcodes `value` make.
fn add_entry(pickle: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    assert!(pickle.ends_with(b"u."), "not a one-SETITEMS pickle");
    let at = pickle.len() - 2;
    let mut ops = text(key);
    ops.extend_from_slice(value);
    pickle.splice(at..at, ops);
}

/// The start of the central directory entry of member `name`.
fn central_entry(b: &[u8], name: &str) -> usize {
    let mut at = 0;
    loop {
        let p = at + find(&b[at..], b"PK\x01\x02");
        let n = u16::from_le_bytes([b[p + 28], b[p + 29]]) as usize;
        if &b[p + 46..p + 46 + n] == name.as_bytes() {
            return p;
        }
        at = p + 4;
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The fixture's bytes changed in place by `f`.
fn edited(file: &str, f: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = std::fs::read(fixtures().join(file)).unwrap();
    f(&mut b);
    b
}

/// The file `os.system` would create if the pickle's call were run.
fn marker(dir: &Path) -> PathBuf {
    dir.join("pwned")
}

/// Opcodes calling `os.system("touch MARKER")`.
fn os_system(dir: &Path) -> Vec<u8> {
    let mut ops = b"cos\nsystem\n(".to_vec();
    ops.extend(text(format!("touch {}", marker(dir).display()).as_bytes()));
    ops.extend_from_slice(b"tR");
    ops
}

// ---------------------------------------------------------------- cases

/// What opening a forged file must give.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// Refused at open, in one line naming the file and containing this.
    Refused(&'static str),
    /// Opens; these tensors are listed as unsupported with a reason
    /// containing the text; every other tensor reads torch's bytes.
    Unsupported(&'static [&'static str], &'static str),
    /// Opens; reading this tensor fails with the text; every other tensor
    /// reads torch's bytes.
    ReadFails(&'static str, &'static str),
    /// Opens with exactly these tensors, each torch's bytes.
    Serves(&'static [&'static str]),
}

/// Makes the hostile file's bytes; given the scratch directory.
type Forge = Box<dyn Fn(&Path) -> Vec<u8>>;

struct Case {
    name: &'static str,
    /// The fixture forged from: the healthy tensors read its bytes.
    base: &'static str,
    forge: Forge,
    want: Want,
}

fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = Vec::new();
    let mut add = |name, base, forge: Forge, want| {
        v.push(Case {
            name,
            base,
            forge,
            want,
        })
    };

    // ---- the archive
    add(
        "archive cut in half",
        "dtypes.pt",
        Box::new(|_| edited("dtypes.pt", |b| b.truncate(b.len() / 2))),
        Want::Refused("a ZIP archive (npz or PyTorch .pt) that cannot be read"),
    );
    add(
        "archive cut inside its central directory",
        "strided.pt",
        Box::new(|_| {
            edited("strided.pt", |b| {
                let cd = central_entry(b, "strided/data/1");
                b.truncate(cd + 10);
            })
        }),
        Want::Refused("a ZIP archive (npz or PyTorch .pt) that cannot be read"),
    );
    add(
        "central directory puts data.pkl at a wrong offset",
        "strided.pt",
        Box::new(|_| {
            edited("strided.pt", |b| {
                let cd = central_entry(b, "strided/data.pkl");
                put_u32(b, cd + 42, 100);
            })
        }),
        Want::Refused("data.pkl: invalid Zip archive: Invalid local file header"),
    );
    add(
        "central directory says data.pkl is 3.75 GiB",
        "strided.pt",
        Box::new(|_| {
            edited("strided.pt", |b| {
                let cd = central_entry(b, "strided/data.pkl");
                put_u32(b, cd + 20, 0xF000_0000);
                put_u32(b, cd + 24, 0xF000_0000);
            })
        }),
        Want::Refused("--index-memory"),
    );
    add(
        "data.pkl altered after its CRC was taken",
        "shared.pt",
        Box::new(|_| {
            edited("shared.pt", |b| {
                let at = find(b, b"rows");
                b[at] = b'R';
            })
        }),
        Want::Refused("shared/data.pkl: Invalid checksum"),
    );
    add(
        "data.pkl one directory too deep",
        "shared.pt",
        Box::new(|_| {
            rebuilt("shared.pt", |m| {
                m[0].0 = "shared/x/data.pkl".into();
            })
        }),
        Want::Refused("no data.pkl in the archive"),
    );
    add(
        "two archive roots",
        "shared.pt",
        Box::new(|_| {
            rebuilt("shared.pt", |m| {
                let copy = m
                    .iter()
                    .map(|(n, d)| (n.replace("shared/", "other/"), d.clone()));
                let copy: Members = copy.collect();
                m.extend(copy);
            })
        }),
        Want::Refused("2 data.pkl entries"),
    );
    add(
        "big-endian byteorder",
        "shared.pt",
        Box::new(|_| {
            rebuilt("shared.pt", |m| {
                *member(m, "shared/byteorder") = b"big".to_vec()
            })
        }),
        Want::Refused("\"big\"-endian"),
    );

    // ---- the pickle
    add(
        "pickle cut inside a string",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                let at = find(p, b"rows");
                p.truncate(at + 2);
            })
        }),
        Want::Refused("pickle truncated at byte"),
    );
    add(
        "pickle string longer than the pickle",
        "shared.pt",
        Box::new(|_| repickled("shared.pt", |p| add_entry(p, b"x", b"X\xff\xff\xff\x7fabc"))),
        Want::Refused("pickle truncated at byte"),
    );
    add(
        "pickle without STOP",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                p.pop();
            })
        }),
        Want::Refused("pickle ends without STOP"),
    );
    add(
        "unknown opcode",
        "shared.pt",
        Box::new(|_| repickled("shared.pt", |p| add_entry(p, b"x", b"\xff"))),
        Want::Refused("pickle opcode 0xff"),
    );
    add(
        "memo get never put",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                let mut tied = text(b"tied");
                tied.extend_from_slice(b"q\x1ch\x0d");
                let mut bad = tied.clone();
                *bad.last_mut().unwrap() = 0xc8;
                replace(p, &tied, &bad);
            })
        }),
        Want::Refused("pickle gets memo 200, never put"),
    );
    add(
        "pop of a mark",
        "shared.pt",
        Box::new(|_| repickled("shared.pt", |p| add_entry(p, b"x", b"(0N"))),
        Want::Refused("pickle pops a mark"),
    );
    add(
        "lists nested 300 deep",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                let mut ops = vec![b']'; 300];
                ops.extend(vec![b'a'; 299]);
                add_entry(p, b"deep", &ops);
            })
        }),
        Want::Refused("nests too deep"),
    );
    add(
        "a list doubled 60 times (2^60 paths)",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                let mut ops = b"]q\xf0".to_vec();
                for _ in 0..60 {
                    // L = [L, L], the old L popped.
                    ops.extend_from_slice(b"0(h\xf0h\xf0lq\xf0");
                }
                add_entry(p, b"laughs", &ops);
            })
        }),
        Want::Refused("too many values to walk"),
    );
    add(
        "a 100 000-dimension size rebuilt 10 000 times",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                // 1.6 GB of sizes and strides if each call kept its own.
                let mut ops = b"(".to_vec();
                ops.extend(b"K\x01".repeat(100_000));
                ops.extend_from_slice(b"tq\xf1(h\x07QK\x00h\xf1h\xf1tq\xf2");
                ops.extend(b"h\x02h\xf2R0".repeat(10_000));
                ops.push(b'N');
                add_entry(p, b"many", &ops);
            })
        }),
        Want::Refused("values (--index-memory)"),
    );
    add(
        "a 1 MiB storage key in 10 000 persistent ids",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                // 10 GB of keys if each storage kept its own.
                let mut ops = b"(h\x03h\x04".to_vec();
                ops.extend(text(&vec![b'k'; 1 << 20]));
                ops.extend_from_slice(b"h\x06K\x18tq\xf3");
                ops.extend(b"h\xf3Q0".repeat(10_000));
                ops.push(b'N');
                add_entry(p, b"keys", &ops);
            })
        }),
        Want::Refused("values (--index-memory)"),
    );
    add(
        "the whole pickle is os.system",
        "shared.pt",
        Box::new(|dir| {
            let mut p = b"\x80\x02".to_vec();
            p.extend(os_system(dir));
            p.push(b'.');
            repickled("shared.pt", move |q| *q = p.clone())
        }),
        Want::Refused("no tensors in the saved object"),
    );
    add(
        "two tensors under one key",
        "shared.pt",
        Box::new(|_| repickled("shared.pt", |p| add_entry(p, b"base", b"h\x0d"))),
        Want::Refused("tensor \"base\": two tensors of the saved object have this name"),
    );
    add(
        "a nested name equal to a flat one",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                let mut ops = b"h\x0d".to_vec();
                ops.extend(text(b"a"));
                ops.push(b'}');
                ops.extend(text(b"b"));
                ops.extend_from_slice(b"h\x0ds");
                add_entry(p, b"a.b", &ops);
            })
        }),
        Want::Refused("tensor \"a.b\": two tensors of the saved object have this name"),
    );

    // ---- malicious but harmless: nothing is run, the tensors are served
    add(
        "os.system among the tensors",
        "strided.pt",
        Box::new(|dir| {
            let ops = os_system(dir);
            repickled("strided.pt", move |p| add_entry(p, b"evil", &ops))
        }),
        Want::Serves(&["plain", "transposed", "every_other", "column"]),
    );
    add(
        "builtins.eval as a tensor's rebuild function",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                // every_other's own GLOBAL: only it is rebuilt by eval.
                replace(
                    p,
                    b"h\x02((h\x03ctorch\nLong",
                    b"cbuiltins\neval\n((h\x03ctorch\nLong",
                );
            })
        }),
        Want::Serves(&["plain", "transposed", "column"]),
    );

    // ---- one tensor (or the views of one storage) bad, the rest served
    add(
        "storage member missing",
        "strided.pt",
        Box::new(|_| rebuilt("strided.pt", |m| m.retain(|(n, _)| n != "strided/data/2"))),
        Want::Unsupported(&["every_other"], "\"strided/data/2\" is not in the archive"),
    );
    add(
        "a module's storage member missing",
        "module.pt",
        Box::new(|_| rebuilt("module.pt", |m| m.retain(|(n, _)| n != "module/data/1"))),
        Want::Unsupported(&["1.weight"], "\"module/data/1\" is not in the archive"),
    );
    add(
        "storage member deflated",
        "strided.pt",
        Box::new(|_| archive(&members("strided.pt"), &["strided/data/0"])),
        Want::Unsupported(&["plain"], "is compressed (Deflated)"),
    );
    add(
        "storage shorter than its tensor",
        "strided.pt",
        Box::new(|_| rebuilt("strided.pt", |m| member(m, "strided/data/2").truncate(40))),
        Want::Unsupported(
            &["every_other"],
            "reaches element 8 of its storage, which holds 5",
        ),
    );
    add(
        "central directory says a storage is 8 bytes",
        "strided.pt",
        Box::new(|_| {
            edited("strided.pt", |b| {
                let cd = central_entry(b, "strided/data/2");
                put_u32(b, cd + 20, 8);
                put_u32(b, cd + 24, 8);
            })
        }),
        Want::Unsupported(
            &["every_other"],
            "reaches element 8 of its storage, which holds 1",
        ),
    );
    add(
        "central directory says a storage runs past the end",
        "strided.pt",
        Box::new(|_| {
            edited("strided.pt", |b| {
                let cd = central_entry(b, "strided/data/2");
                put_u32(b, cd + 20, 0x7000_0000);
                put_u32(b, cd + 24, 0x7000_0000);
            })
        }),
        Want::Unsupported(&["every_other"], "lies past the end of the file"),
    );
    add(
        "central directory points a storage into another's bytes",
        "strided.pt",
        Box::new(|_| {
            edited("strided.pt", |b| {
                let cd = central_entry(b, "strided/data/2");
                put_u32(b, cd + 42, 1000);
            })
        }),
        Want::Unsupported(
            &["every_other"],
            "\"strided/data/2\": invalid Zip archive: Invalid local file header",
        ),
    );
    add(
        "central directory points a storage at another member",
        "strided.pt",
        Box::new(|_| {
            edited("strided.pt", |b| {
                let other = central_entry(b, "strided/data/1");
                let at = u32::from_le_bytes(b[other + 42..other + 46].try_into().unwrap());
                let cd = central_entry(b, "strided/data/0");
                put_u32(b, cd + 42, at);
            })
        }),
        Want::Unsupported(&["plain"], "points at the entry of \"strided/data/1\""),
    );
    add(
        "central directory points a storage at a member of a longer name",
        "strided.pt",
        Box::new(|_| {
            edited("strided.pt", |b| {
                let other = central_entry(b, "strided/version");
                let at = u32::from_le_bytes(b[other + 42..other + 46].try_into().unwrap());
                let cd = central_entry(b, "strided/data/2");
                put_u32(b, cd + 42, at);
            })
        }),
        Want::Unsupported(
            &["every_other"],
            "points at the local entry of a name of 15 bytes",
        ),
    );
    add(
        "storage key climbing out of the archive",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                let mut from = text(b"0");
                from.extend_from_slice(b"q\x05");
                let mut to = text(b"../../../etc/passwd");
                to.extend_from_slice(b"q\x05");
                replace(p, &from, &to);
            })
        }),
        Want::Unsupported(
            &["plain"],
            "\"strided/data/../../../etc/passwd\" is not in the archive",
        ),
    );
    add(
        "unknown storage class",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                replace(p, b"torch\nIntStorage", b"torch\nNutStorage")
            })
        }),
        Want::Unsupported(&["plain"], "torch.nut has no element type here"),
    );
    add(
        "negative storage offset",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                let mut to = b"\x07Q".to_vec();
                to.extend(int(-1));
                to.extend_from_slice(b"K\x05\x85");
                replace(p, b"\x07QK\x00K\x05\x85", &to);
            })
        }),
        Want::Unsupported(
            &["plain"],
            "a storage offset that is not an integer of 0 or more",
        ),
    );
    add(
        "huge storage offset",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                let mut to = b"q!Q".to_vec();
                to.extend(long(1 << 40));
                replace(p, b"q!QK\x01", &to);
            })
        }),
        Want::Unsupported(
            &["column"],
            "reaches element 1099511627784 of its storage, which holds 12",
        ),
    );
    add(
        "negative dimension",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                let mut to = b"\x1aQK\x00".to_vec();
                to.extend(int(-5));
                to.push(0x85);
                replace(p, b"\x1aQK\x00K\x05\x85", &to);
            })
        }),
        Want::Unsupported(&["every_other"], "a size that is not a tuple of integers"),
    );
    add(
        "element count overflows",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                let mut to = b"\x11QK\x00".to_vec();
                to.extend(long(1 << 62));
                to.extend(long(1 << 62));
                to.push(0x86);
                replace(p, b"\x11QK\x00K\x04K\x03\x86", &to);
            })
        }),
        Want::Unsupported(&["transposed"], "its size overflows"),
    );
    add(
        "stride overflows",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                let mut to = b"q\x1b".to_vec();
                to.extend(long(1 << 62));
                to.push(0x85);
                replace(p, b"q\x1bK\x02\x85", &to);
            })
        }),
        Want::Unsupported(&["every_other"], "its size overflows"),
    );
    add(
        "fewer strides than dimensions",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                replace(p, b"q\x12K\x01K\x04\x86", b"q\x12K\x01\x85")
            })
        }),
        Want::Unsupported(&["transposed"], "1 strides for 2 dimensions"),
    );
    add(
        "persistent id of one item",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                // The pid ("storage", IntStorage, "0", "cpu", 5) popped
                // for ("storage",).
                replace(p, b"tq\x07Q", b"tq\x070(h\x03tQ");
            })
        }),
        Want::Unsupported(&["plain"], "a first argument that is not a storage"),
    );
    add(
        "a later persistent id of a key names another class",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                // rows' pid names storage "0" a DoubleStorage: torch keeps
                // the FloatStorage its first pid loaded.
                replace(
                    p,
                    b"h\x02((h\x03h\x04h\x05h\x06K\x18tq\x0f",
                    b"h\x02((h\x03ctorch\nDoubleStorage\nh\x05h\x06K\x18tq\x0f",
                )
            })
        }),
        Want::Serves(&["base", "rows", "last", "tied"]),
    );
    add(
        "a storage whose count of elements is under its record's",
        "shared.pt",
        Box::new(|_| {
            repickled("shared.pt", |p| {
                // The first pid of storage "0" says 20 floats (the record
                // holds 24, and later pids say 24): torch makes it 20.
                replace(p, b"q\x06K\x18tq\x07Q", b"q\x06K\x14tq\x07Q")
            })
        }),
        Want::Unsupported(&["base", "last", "tied"], "of its storage, which holds 20"),
    );
    add(
        "a quantized tensor's rebuild function",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                replace(
                    p,
                    b"h\x02((h\x03ctorch\nLong",
                    b"ctorch._utils\n_rebuild_qtensor\n((h\x03ctorch\nLong",
                )
            })
        }),
        Want::Unsupported(
            &["every_other"],
            "torch._utils._rebuild_qtensor: a kind of tensor not read here",
        ),
    );
    add(
        "a tensor subclass wrapping _rebuild_tensor_v2",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                // every_other = _rebuild_from_type_v2(_rebuild_tensor_v2,
                // Tensor, (its args), {}).
                replace(
                    p,
                    b"q\x17h\x02((h\x03",
                    b"q\x17ctorch._tensor\n_rebuild_from_type_v2\n(h\x02ctorch\nTensor\n((h\x03",
                );
                replace(p, b"tq\x1eRq\x1f", b"tq\x1e}tRq\x1f");
            })
        }),
        Want::Serves(&["plain", "transposed", "every_other", "column"]),
    );
    add(
        "a tensor subclass wrapping os.system",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                replace(
                    p,
                    b"q\x17h\x02((h\x03",
                    b"q\x17ctorch._tensor\n_rebuild_from_type_v2\n(cos\nsystem\nctorch\nTensor\n((h\x03",
                );
                replace(p, b"tq\x1eRq\x1f", b"tq\x1e}tRq\x1f");
            })
        }),
        Want::Unsupported(
            &["every_other"],
            "torch._tensor._rebuild_from_type_v2 of a function other than",
        ),
    );
    add(
        "tensor name with a NUL byte",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                replace(p, &text(b"plain"), &text(b"pl\0in"))
            })
        }),
        Want::Refused("tensor \"pl\\0in\": a tensor name with a NUL byte"),
    );
    add(
        "tensor name climbing out of the mount",
        "strided.pt",
        Box::new(|_| {
            repickled("strided.pt", |p| {
                replace(p, &text(b"plain"), &text(b"../../plain"))
            })
        }),
        Want::Serves(&["../../plain", "transposed", "every_other", "column"]),
    );

    // ---- a tensor's bytes bad: its reads fail
    add(
        "bool byte of 2",
        "dtypes.pt",
        Box::new(|_| rebuilt("dtypes.pt", |m| member(m, "dtypes/data/9")[1] = 2)),
        Want::ReadFails("bool", "neither 0 nor 1"),
    );
    v
}

/// Where `name` of a forged file gets its expected bytes in `base`.
fn fixture_name(name: &str) -> &str {
    name.trim_start_matches("../")
}

/// The tensor names of fixture `file`, in order.
fn names_of(file: &str) -> Vec<String> {
    let o = formats::open(&fixtures().join(file), Limits::default()).unwrap();
    o.catalog.tensors.into_iter().map(|t| t.name).collect()
}

/// Every tensor of `data` but `bad` reads torch's bytes for it, in odd
/// chunks; the names it has.
fn healthy_read_right(
    case: &str,
    base: &str,
    data: &ztensor_mount::serve::data::Data,
    bad: &[&str],
) -> Vec<String> {
    let cat = data.catalog();
    let mut names = Vec::new();
    for (ti, t) in cat.tensors.iter().enumerate() {
        names.push(t.name.clone());
        if bad.contains(&t.name.as_str()) {
            continue;
        }
        let got = read_whole(data, ti, 0, 7).unwrap_or_else(|e| panic!("{case}: {}: {e}", t.name));
        assert_eq!(
            got,
            expected(base, fixture_name(&t.name)),
            "{case}: {}",
            t.name
        );
    }
    names
}

/// Opens one forged file and checks what it must give.
fn check(c: &Case, path: &Path, scratch: &Path) {
    let opened = formats::open(path, Limits::default());
    match (c.want, opened) {
        (Want::Refused(text), Err(e)) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "{}: {line}", c.name);
            assert!(
                line.starts_with(&path.display().to_string()),
                "{}: {line}",
                c.name
            );
            assert!(line.contains(text), "{}: {line:?} lacks {text:?}", c.name);
        }
        (Want::Refused(_), Ok(o)) => {
            let names: Vec<_> = o.catalog.tensors.iter().map(|t| &t.name).collect();
            panic!("{}: opened: {names:?}", c.name)
        }
        (_, Err(e)) => panic!("{}: refused: {e}", c.name),
        (Want::Unsupported(bad, text), Ok(o)) => {
            let data = serve(o, scratch, 1 << 20);
            let cat = data.catalog();
            for t in bad {
                let why = cat.tensors[tensor_index(cat, t)]
                    .parts
                    .as_ref()
                    .err()
                    .unwrap_or_else(|| panic!("{}: {t} served", c.name));
                assert!(
                    why.contains(text),
                    "{}: {t}: {why:?} lacks {text:?}",
                    c.name
                );
                assert!(!why.contains('\n'), "{}: {why}", c.name);
            }
            let names = healthy_read_right(c.name, c.base, &data, bad);
            // Nothing else lost: every tensor of the fixture is listed.
            assert_eq!(names, names_of(c.base), "{}", c.name);
            assert!(names.len() > bad.len(), "{}: no healthy neighbour", c.name);
        }
        (Want::ReadFails(bad, text), Ok(o)) => {
            let data = serve(o, scratch, 1 << 20);
            let ti = tensor_index(data.catalog(), bad);
            let e = read_whole(&data, ti, 0, 1 << 20)
                .err()
                .unwrap_or_else(|| panic!("{}: {bad} read", c.name));
            assert!(e.contains(text), "{}: {e:?} lacks {text:?}", c.name);
            let names = healthy_read_right(c.name, c.base, &data, &[bad]);
            assert_eq!(names, names_of(c.base), "{}", c.name);
            assert!(names.len() > 1, "{}: no healthy neighbour", c.name);
        }
        (Want::Serves(want), Ok(o)) => {
            let data = serve(o, scratch, 1 << 20);
            let names = healthy_read_right(c.name, c.base, &data, &[]);
            assert_eq!(names, want, "{}", c.name);
        }
    }
    assert!(!marker(scratch).exists(), "{}: the pickle ran code", c.name);
}

/// Writes case `c` into `dir`.
fn write_case(c: &Case, dir: &Path, i: usize) -> PathBuf {
    let path = dir.join(format!("case{i}.pt"));
    std::fs::write(&path, (c.forge)(dir)).unwrap();
    path
}

#[test]
fn hostile_files_are_refused_in_one_line_or_fail_one_tensor() {
    let all = cases();
    assert!(all.len() >= 20, "{} cases", all.len());
    let mut failed = Vec::new();
    for (i, c) in all.iter().enumerate() {
        let scratch = tempfile::tempdir().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let path = write_case(c, scratch.path(), i);
            check(c, &path, scratch.path());
        }));
        if r.is_err() {
            failed.push(c.name);
        }
    }
    assert!(failed.is_empty(), "cases failed: {failed:?}");
}

/// Every forged file still detects as a `.pt` file: the cases test the
/// `.pt` reader, not detection falling through to another format.
#[test]
fn every_case_reaches_the_pt_reader() {
    let scratch = tempfile::tempdir().unwrap();
    for (i, c) in cases().iter().enumerate() {
        let bytes = (c.forge)(scratch.path());
        if matches!(c.want, Want::Refused(t) if t.contains("a ZIP archive (npz or PyTorch .pt)")) {
            continue;
        }
        assert_eq!(
            formats::detect(&bytes).name(),
            Some("PyTorch .pt"),
            "case {i}: {}",
            c.name
        );
    }
}

fn case(name: &str) -> (usize, Case) {
    cases()
        .into_iter()
        .enumerate()
        .find(|(_, c)| c.name == name)
        .unwrap_or_else(|| panic!("no case {name:?}"))
}

/// A few cases through the binary: a refused file is one line on stderr
/// naming it and exit status 1; a bad tensor is EIO (or listed without a
/// file) while its neighbour reads right, and the mount comes down clean.
#[test]
fn through_a_mount_refusals_are_one_line_and_bad_tensors_alone_fail() {
    let _serial = support::serial();
    for name in [
        "archive cut in half",
        "central directory says data.pkl is 3.75 GiB",
        "lists nested 300 deep",
        "the whole pickle is os.system",
    ] {
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        let (i, c) = case(name);
        let dir = m.scratch_path("");
        let path = write_case(&c, &dir, i);
        let Want::Refused(text) = c.want else {
            panic!("{name}: not a refusal")
        };
        let r = m.run(&path, &[]);
        assert_eq!(r.status.code(), Some(1), "{name}: {r:?}");
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 1, "{name}: {:?}", r.stderr);
        assert!(
            lines[0].contains(&path.display().to_string()),
            "{name}: {}",
            lines[0]
        );
        assert!(lines[0].contains(text), "{name}: {}", lines[0]);
        assert!(!m.is_mounted(), "{name}");
        assert!(!marker(&dir).exists(), "{name}: the pickle ran code");
        m.cleanup();
    }

    // A bad bool: EIO on it, the rest right.
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let (i, c) = case("bool byte of 2");
    let path = write_case(&c, &m.scratch_path(""), i);
    m.mount(&path, &[]);
    let e = std::fs::read(m.path("bool")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(m.read("f32"), expected("dtypes.pt", "f32"));
    assert_eq!(m.read("u16"), expected("dtypes.pt", "u16"));
    m.unmount_ok();
    m.cleanup();

    // A missing storage and a tensor past its storage: listed with the
    // reason and no file; their neighbours read.
    for (name, bad, reason) in [
        (
            "storage member missing",
            "every_other",
            "not in the archive",
        ),
        ("huge storage offset", "column", "reaches element"),
    ] {
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        let (i, c) = case(name);
        let path = write_case(&c, &m.scratch_path(""), i);
        m.mount(&path, &[]);
        let index = m.index();
        let t = index["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == bad)
            .unwrap_or_else(|| panic!("{name}: {bad} not listed"))
            .clone();
        assert_eq!(t["supported"], false, "{name}: {t}");
        let why = t["unsupported_reason"].as_str().unwrap();
        assert!(why.contains(reason), "{name}: {why}");
        assert!(
            std::fs::metadata(m.path(bad)).is_err(),
            "{name}: {bad} has a file"
        );
        assert_eq!(m.read("plain"), expected("strided.pt", "plain"), "{name}");
        assert_eq!(
            m.read("transposed"),
            expected("strided.pt", "transposed"),
            "{name}"
        );
        m.unmount_ok();
        m.cleanup();
    }

    // A name climbing out of the mount stays inside it, escaped.
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let (i, c) = case("tensor name climbing out of the mount");
    let path = write_case(&c, &m.scratch_path(""), i);
    m.mount(&path, &[]);
    let index = m.index();
    let t = &index["tensors"][0];
    assert_eq!(t["name"], "../../plain", "{t}");
    assert_eq!(t["path"], "%2E%2E/%2E%2E/plain", "{t}");
    assert_eq!(
        m.read("%2E%2E/%2E%2E/plain"),
        expected("strided.pt", "plain")
    );
    assert!(!m.scratch_path("plain").exists());
    m.unmount_ok();
    m.cleanup();

    // os.system inside the saved dict: nothing run, the tensors served.
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("");
    let (i, c) = case("os.system among the tensors");
    let path = write_case(&c, &dir, i);
    m.mount(&path, &[]);
    assert_eq!(m.index()["tensors"].as_array().unwrap().len(), 4);
    assert_eq!(m.read("column"), expected("strided.pt", "column"));
    assert!(!marker(&dir).exists(), "the pickle ran code");
    m.unmount_ok();
    m.cleanup();
}

/// Every prefix (in steps) of each fixture, seeded byte flips anywhere in
/// it, and seeded byte flips in its pickle with the archive rebuilt (so
/// the CRC holds and the evaluator sees them): open refuses in one line
/// naming the file, or every tensor reads or fails; never a panic.
#[test]
fn cut_and_flipped_files_never_panic() {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("x.pt");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut opened = 0;
    for file in ["dtypes.pt", "shared.pt", "strided.pt", "module.pt"] {
        let orig = std::fs::read(fixtures().join(file)).unwrap();
        let mut variants: Vec<Vec<u8>> = Vec::new();
        for cut in (0..orig.len()).step_by(orig.len() / 50) {
            variants.push(orig[..cut].to_vec());
        }
        for _ in 0..100 {
            let mut b = orig.clone();
            for _ in 0..1 + rand() % 4 {
                let at = (rand() % b.len() as u64) as usize;
                b[at] = rand() as u8;
            }
            variants.push(b);
        }
        let stem = file.trim_end_matches(".pt");
        for _ in 0..100 {
            let mut m = members(file);
            let p = member(&mut m, &format!("{stem}/data.pkl"));
            for _ in 0..1 + rand() % 3 {
                let at = (rand() % p.len() as u64) as usize;
                p[at] = rand() as u8;
            }
            variants.push(archive(&m, &[]));
        }
        for b in variants {
            std::fs::write(&path, &b).unwrap();
            match formats::open(&path, Limits::default()) {
                Err(e) => {
                    let line = e.to_string();
                    assert!(!line.contains('\n'), "{line}");
                    assert!(line.starts_with(&path.display().to_string()), "{line}");
                }
                Ok(o) => {
                    opened += 1;
                    let data = serve(o, scratch.path(), 1 << 20);
                    for ti in 0..data.catalog().len() {
                        let _ = read_whole(&data, ti, 0, 1 << 16);
                    }
                }
            }
        }
    }
    // Flips in storage bytes and padding leave a file that opens.
    assert!(opened > 0);
}
