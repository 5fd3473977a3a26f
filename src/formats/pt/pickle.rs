//! The restricted pickle evaluator: a stack machine that rebuilds the
//! saved object's containers and tensors, runs no code, and keeps every
//! object it does not know opaque.

use std::collections::HashMap;
use std::sync::Arc;

use super::element_type;

/// Most opcodes evaluated.
const MAX_OPS: u64 = 100_000_000;
/// Deepest nesting of containers walked for tensors.
const MAX_DEPTH: usize = 256;
/// Longest tensor name made of nested keys.
const MAX_NAME: usize = 64 << 10;

/// A tensor as `_rebuild_tensor*` describes it.
#[derive(Debug, Clone)]
pub(super) struct TensorRef {
    /// Index in `Vm::storages`.
    pub(super) storage: usize,
    /// torch's dtype name (`float32`).
    pub(super) dtype: String,
    /// In elements.
    pub(super) offset: u64,
    pub(super) shape: Vec<u64>,
    pub(super) stride: Vec<u64>,
}

#[derive(Debug, Clone)]
pub(super) struct StorageRef {
    pub(super) key: String,
    /// torch's dtype name for a typed storage; `None` for an untyped one
    /// (`torch.storage.UntypedStorage`: the tensor names its dtype).
    pub(super) dtype: Option<String>,
    /// Its elements, as the persistent id says (`None` when it says no
    /// count): torch makes the storage that size, whatever the record's.
    numel: Option<u64>,
}

impl StorageRef {
    /// The storage's size in bytes, as torch makes it: its count of
    /// elements of its own dtype (bytes for an untyped one).
    pub(super) fn nbytes(&self) -> std::result::Result<u64, String> {
        let numel = self
            .numel
            .ok_or("its storage's persistent id gives no element count (numel)")?;
        let size = match &self.dtype {
            None => 1,
            Some(d) => element_type(d)
                .ok_or_else(|| format!("its storage's torch.{d} has no element type here"))?
                .size(),
        };
        numel
            .checked_mul(size)
            .ok_or_else(|| "its storage's size overflows".to_string())
    }
}

/// A value on the stack. Containers live in `Vm::nodes` and are named by
/// index, so copies (memo gets, `DUP`) are cheap and share.
#[derive(Debug, Clone)]
pub(super) enum Val {
    None,
    Int(i64),
    Str(Arc<str>),
    Global(Arc<str>, Arc<str>),
    /// Tuple, list or set.
    Seq(usize),
    Dict(usize),
    Storage(usize),
    Tensor(usize),
    Mark,
    /// Anything else: a float, bytes, an object of a class not known here.
    Opaque,
}

enum Node {
    Seq(Vec<Val>),
    Dict(Vec<(Val, Val)>),
}

pub(super) struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: HashMap<u64, Val>,
    nodes: Vec<Node>,
    pub(super) storages: Vec<StorageRef>,
    /// Index in `storages` of each key's first persistent id: torch loads
    /// a key once, and later ids of it (even naming another class or
    /// count) get that storage.
    by_key: HashMap<String, usize>,
    /// Each tensor rebuilt, or why its arguments could not be read.
    tensors: Vec<std::result::Result<TensorRef, String>>,
    /// Values held in containers, the stack and the memo, against `cap`.
    cells: u64,
    pub(super) cap: u64,
}

pub(super) type VmResult<T> = std::result::Result<T, String>;

/// The refusal of an opcode this reader does not run.
fn unread(op: u8, at: usize) -> String {
    format!("pickle opcode 0x{op:02x} at byte {at} is not read here")
}

impl<'a> Vm<'a> {
    pub(super) fn new(data: &'a [u8], index_memory: u64) -> Vm<'a> {
        Vm {
            data,
            pos: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            nodes: Vec::new(),
            storages: Vec::new(),
            by_key: HashMap::new(),
            tensors: Vec::new(),
            cells: 0,
            // A cell takes about 32 bytes with its share of a container.
            cap: (index_memory / 32).max(1 << 16),
        }
    }

    fn take(&mut self, n: u64) -> VmResult<&'a [u8]> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| format!("pickle truncated at byte {}", self.pos))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn le(&mut self, n: u64) -> VmResult<u64> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x)))
    }

    fn line(&mut self) -> VmResult<&'a [u8]> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| format!("pickle truncated at byte {}", self.pos))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    fn count(&mut self, n: u64) -> VmResult<()> {
        self.cells += n;
        if self.cells > self.cap {
            return Err(format!(
                "the pickle holds more than {} values (--index-memory)",
                self.cap
            ));
        }
        Ok(())
    }

    fn push(&mut self, v: Val) -> VmResult<()> {
        self.count(1)?;
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> VmResult<Val> {
        if self
            .marks
            .last()
            .is_some_and(|&m| m + 1 >= self.stack.len())
        {
            return Err(format!("pickle pops a mark at byte {}", self.pos));
        }
        self.stack
            .pop()
            .ok_or_else(|| format!("pickle stack empty at byte {}", self.pos))
    }

    fn pop_mark(&mut self) -> VmResult<Vec<Val>> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| format!("pickle has no mark at byte {}", self.pos))?;
        let items = self.stack.split_off(m + 1);
        self.stack.pop();
        Ok(items)
    }

    fn node(&mut self, n: Node) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    fn seq(&mut self, items: Vec<Val>) -> VmResult<Val> {
        let v = Val::Seq(self.node(Node::Seq(items)));
        self.push(v)?;
        Ok(Val::None)
    }

    fn str_of(bytes: &[u8]) -> Val {
        Val::Str(Arc::from(String::from_utf8_lossy(bytes).as_ref()))
    }

    /// Runs the pickle; the value it leaves.
    pub(super) fn run(&mut self) -> VmResult<Val> {
        let mut ops = 0u64;
        loop {
            ops += 1;
            if ops > MAX_OPS {
                return Err("pickle too long (opcode limit)".into());
            }
            let at = self.pos;
            let op = *self.data.get(self.pos).ok_or("pickle ends without STOP")?;
            self.pos += 1;
            if op == b'.' {
                return self.pop(); // STOP
            }
            self.step(op, at)?;
        }
    }

    /// One opcode other than STOP, by its family.
    fn step(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            0x80 | 0x95 | b'(' | b'0' | b'1' | b'2' | 0x97 | 0x98 => self.framing(op, at),
            b'N' | 0x88 | 0x89 | b'J' | b'K' | b'M' | 0x8a | 0x8b | b'I' | b'L' | b'G' | b'F' => {
                self.scalar(op, at)
            }
            b'X' | 0x8c | 0x8d | b'T' | b'U' | b'V' | b'S' | b'B' | b'C' | 0x8e | 0x96 => {
                self.string(op, at)
            }
            b')'
            | b']'
            | 0x8f
            | b'}'
            | b't'
            | b'l'
            | 0x91
            | 0x85..=0x87
            | b'd'
            | b'a'
            | b'e'
            | 0x90
            | b's'
            | b'u' => self.container(op, at),
            b'c' | 0x93 | b'R' | 0x81 | 0x92 | b'b' | b'i' | b'o' | b'Q' | b'P' => {
                self.object(op, at)
            }
            b'p' | b'q' | b'r' | 0x94 | b'g' | b'h' | b'j' => self.memo(op, at),
            other => Err(unread(other, at)),
        }
    }

    /// Framing and the stack itself: PROTO, FRAME, MARK, POP, POP_MARK,
    /// DUP, and out-of-band buffers.
    fn framing(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            0x80 => {
                self.take(1)?; // PROTO
            }
            0x95 => {
                self.take(8)?; // FRAME: a hint only
            }
            b'(' => {
                self.marks.push(self.stack.len());
                self.push(Val::Mark)?;
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self
                    .stack
                    .last()
                    .cloned()
                    .ok_or_else(|| format!("pickle stack empty at byte {at}"))?;
                self.push(v)?;
            }
            0x97 => self.push(Val::Opaque)?, // NEXT_BUFFER
            0x98 => {}                       // READONLY_BUFFER
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// None, bools, ints and floats.
    fn scalar(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b'N' => self.push(Val::None)?,
            0x88 | 0x89 => self.push(Val::Opaque)?, // NEWTRUE, NEWFALSE
            b'J' => {
                let v = self.le(4)? as u32 as i32;
                self.push(Val::Int(i64::from(v)))?;
            }
            b'K' => {
                let v = self.le(1)?;
                self.push(Val::Int(v as i64))?;
            }
            b'M' => {
                let v = self.le(2)?;
                self.push(Val::Int(v as i64))?;
            }
            0x8a | 0x8b => {
                // LONG1, LONG4: little-endian two's complement.
                let n = if op == 0x8a { self.le(1)? } else { self.le(4)? };
                let b = self.take(n)?;
                let v = if b.len() <= 8 {
                    let neg = b.last().is_some_and(|&x| x & 0x80 != 0);
                    let mut v: i64 = if neg { -1 } else { 0 };
                    for &x in b.iter().rev() {
                        v = (v << 8) | i64::from(x);
                    }
                    Val::Int(v)
                } else {
                    Val::Opaque
                };
                self.push(v)?;
            }
            b'I' | b'L' => {
                let l = self.line()?;
                let s = String::from_utf8_lossy(l);
                let v = s
                    .trim()
                    .trim_end_matches('L')
                    .parse()
                    .map_or(Val::Opaque, Val::Int);
                self.push(v)?;
            }
            b'G' => {
                self.take(8)?;
                self.push(Val::Opaque)?;
            }
            b'F' => {
                self.line()?;
                self.push(Val::Opaque)?;
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// Strings (kept) and bytes (skipped).
    fn string(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b'X' | 0x8c | 0x8d | b'T' | b'U' => {
                let n = match op {
                    b'X' | b'T' => self.le(4)?,
                    0x8d => self.le(8)?,
                    _ => self.le(1)?,
                };
                let b = self.take(n)?;
                self.count(n / 32)?;
                self.push(Self::str_of(b))?;
            }
            b'V' | b'S' => {
                let l = self.line()?;
                let l = if op == b'S' {
                    l.strip_prefix(b"'")
                        .and_then(|l| l.strip_suffix(b"'"))
                        .unwrap_or(l)
                } else {
                    l
                };
                self.push(Self::str_of(l))?;
            }
            b'B' | b'C' | 0x8e | 0x96 => {
                let n = match op {
                    b'B' => self.le(4)?,
                    b'C' => self.le(1)?,
                    _ => self.le(8)?,
                };
                self.take(n)?;
                self.push(Val::Opaque)?;
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// Tuples, lists, sets and dicts: made, and added to.
    fn container(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b')' => {
                self.seq(Vec::new())?;
            }
            b']' | 0x8f => {
                self.seq(Vec::new())?; // EMPTY_LIST, EMPTY_SET
            }
            b'}' => {
                let v = Val::Dict(self.node(Node::Dict(Vec::new())));
                self.push(v)?;
            }
            b't' | b'l' | 0x91 => {
                let items = self.pop_mark()?;
                self.seq(items)?; // TUPLE, LIST, FROZENSET
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.seq(items)?;
            }
            b'd' => {
                let items = self.pop_mark()?;
                let pairs = pairs(items);
                let v = Val::Dict(self.node(Node::Dict(pairs)));
                self.push(v)?;
            }
            b'a' | b'e' | 0x90 => {
                let items = if op == b'a' {
                    vec![self.pop()?]
                } else {
                    self.pop_mark()?
                };
                match self.stack.last() {
                    Some(Val::Seq(i)) => {
                        if let Some(Node::Seq(v)) = self.nodes.get_mut(*i) {
                            v.extend(items);
                        }
                    }
                    Some(_) => {}
                    None => return Err(format!("pickle appends to nothing at byte {at}")),
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    vec![k, v]
                } else {
                    self.pop_mark()?
                };
                match self.stack.last() {
                    Some(Val::Dict(i)) => {
                        if let Some(Node::Dict(v)) = self.nodes.get_mut(*i) {
                            v.extend(pairs(items));
                        }
                    }
                    Some(_) => {}
                    None => return Err(format!("pickle sets items of nothing at byte {at}")),
                }
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// Globals, calls, BUILD, persistent ids (the storages), and objects
    /// not read here.
    fn object(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                let v = Val::Global(
                    Arc::from(String::from_utf8_lossy(module).as_ref()),
                    Arc::from(String::from_utf8_lossy(name).as_ref()),
                );
                self.push(v)?;
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let v = match (module, name) {
                    (Val::Str(m), Val::Str(n)) => Val::Global(m, n),
                    _ => Val::Opaque,
                };
                self.push(v)?;
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let f = self.pop()?;
                let v = self.call(&f, &args)?;
                self.push(v)?;
            }
            0x92 => {
                self.pop()?; // NEWOBJ_EX's kwargs
                let args = self.pop()?;
                let f = self.pop()?;
                let v = self.call(&f, &args)?;
                self.push(v)?;
            }
            b'b' => {
                // BUILD: a dict's state adds to it; an object of a
                // class not known here is shown as its state, so the
                // tensors of a pickled module are still found.
                let state = self.pop()?;
                let obj = self.pop()?;
                let v = match (&obj, &state) {
                    (Val::Dict(o), Val::Dict(s)) if o != s => {
                        let more = match self.nodes.get(*s) {
                            Some(Node::Dict(m)) => m.clone(),
                            _ => Vec::new(),
                        };
                        self.count(more.len() as u64)?;
                        if let Some(Node::Dict(d)) = self.nodes.get_mut(*o) {
                            d.extend(more);
                        }
                        obj
                    }
                    (Val::Opaque, _) => state,
                    _ => obj,
                };
                self.push(v)?;
            }
            b'i' => {
                self.line()?;
                self.line()?;
                self.pop_mark()?;
                self.push(Val::Opaque)?; // INST
            }
            b'o' => {
                self.pop_mark()?;
                self.push(Val::Opaque)?; // OBJ
            }
            b'Q' => {
                let pid = self.pop()?;
                let v = self.persistent(&pid)?;
                self.push(v)?;
            }
            b'P' => {
                self.line()?;
                self.push(Val::Opaque)?;
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// The memo: PUT and GET in their forms.
    fn memo(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b'p' | b'q' | b'r' | 0x94 => {
                let key = match op {
                    b'p' => {
                        let l = self.line()?;
                        String::from_utf8_lossy(l)
                            .trim()
                            .parse()
                            .map_err(|_| format!("bad PUT at byte {at}"))?
                    }
                    b'q' => self.le(1)?,
                    b'r' => self.le(4)?,
                    _ => self.memo.len() as u64,
                };
                let top = self
                    .stack
                    .last()
                    .cloned()
                    .ok_or_else(|| format!("pickle memoizes nothing at byte {at}"))?;
                self.count(1)?;
                self.memo.insert(key, top);
            }
            b'g' | b'h' | b'j' => {
                let key = match op {
                    b'g' => {
                        let l = self.line()?;
                        String::from_utf8_lossy(l)
                            .trim()
                            .parse()
                            .map_err(|_| format!("bad GET at byte {at}"))?
                    }
                    b'h' => self.le(1)?,
                    _ => self.le(4)?,
                };
                let v =
                    self.memo.get(&key).cloned().ok_or_else(|| {
                        format!("pickle gets memo {key}, never put, at byte {at}")
                    })?;
                self.push(v)?;
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    fn items(&self, v: &Val) -> &[Val] {
        match v {
            Val::Seq(i) => match self.nodes.get(*i) {
                Some(Node::Seq(items)) => items,
                _ => &[],
            },
            _ => &[],
        }
    }

    fn dims(&self, v: &Val) -> Option<Vec<u64>> {
        self.items(v)
            .iter()
            .map(|d| match d {
                Val::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            })
            .collect()
    }

    /// `REDUCE`: the few callables torch's tensors are rebuilt with.
    fn call(&mut self, f: &Val, args: &Val) -> VmResult<Val> {
        let Val::Global(module, name) = f else {
            return Ok(Val::Opaque);
        };
        // At most the 7 arguments `_rebuild_tensor_v3` takes: a huge tuple
        // reduced again and again costs nothing.
        let args: Vec<Val> = self.items(args).iter().take(8).cloned().collect();
        Ok(match (&**module, &**name) {
            ("collections", "OrderedDict") | ("builtins", "dict") | ("__builtin__", "dict") => {
                Val::Dict(self.node(Node::Dict(Vec::new())))
            }
            ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
                match args.first() {
                    Some(t @ Val::Tensor(_)) => t.clone(),
                    _ => Val::Opaque,
                }
            }
            ("torch._utils", "_rebuild_tensor" | "_rebuild_tensor_v2" | "_rebuild_tensor_v3") => {
                let t = self
                    .rebuild(name, &args)
                    .map_err(|why| format!("{module}.{name} with {why}"));
                self.tensor(t)?
            }
            // A tensor subclass: `(func, type, func's args, state)`; the
            // tensor is what `func` rebuilds, the subclass is left aside.
            ("torch._tensor" | "torch._utils", "_rebuild_from_type" | "_rebuild_from_type_v2") => {
                let t = match (args.first(), args.get(2)) {
                    (Some(Val::Global(m, f)), Some(inner))
                        if &**m == "torch._utils"
                            && matches!(
                                &**f,
                                "_rebuild_tensor" | "_rebuild_tensor_v2" | "_rebuild_tensor_v3"
                            ) =>
                    {
                        let inner: Vec<Val> = self.items(inner).iter().take(8).cloned().collect();
                        self.rebuild(f, &inner)
                            .map_err(|why| format!("{m}.{f} with {why}"))
                    }
                    _ => Err(format!(
                        "{module}.{name} of a function other than torch's _rebuild_tensor*"
                    )),
                };
                self.tensor(t)?
            }
            // torch's other rebuilds (quantized, sparse, nested, meta
            // tensors...): listed, not read.
            ("torch._utils", n) if n.starts_with("_rebuild_") => {
                self.tensor(Err(format!("{module}.{n}: a kind of tensor not read here")))?
            }
            _ => Val::Opaque,
        })
    }

    /// A tensor torch rebuilt, or why it is not read, as a value; counted
    /// against the budget.
    fn tensor(&mut self, t: VmResult<TensorRef>) -> VmResult<Val> {
        // Each call holds its own size and stride: a tuple got from the
        // memo and reduced again and again is counted.
        self.count(match &t {
            Ok(t) => 1 + (t.shape.len() + t.stride.len()) as u64,
            Err(why) => 1 + why.len() as u64 / 32,
        })?;
        self.tensors.push(t);
        Ok(Val::Tensor(self.tensors.len() - 1))
    }

    /// `_rebuild_tensor*(storage, storage_offset, size, stride, ...)`; v3
    /// adds the dtype after the hooks (for an untyped storage). What is
    /// wrong with the arguments when they do not describe a tensor.
    fn rebuild(&self, name: &str, args: &[Val]) -> VmResult<TensorRef> {
        let needed = if name == "_rebuild_tensor_v3" { 7 } else { 4 };
        if args.len() < needed {
            return Err(format!("{} arguments, not {needed}", args.len()));
        }
        let at = match &args[0] {
            Val::Storage(s) => self.storages.get(*s).map(|st| (*s, st)),
            _ => None,
        };
        let Some((s, storage)) = at else {
            return Err("a first argument that is not a storage \
                        (a persistent id (\"storage\", class, key, ...))"
                .into());
        };
        let offset = match &args[1] {
            Val::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
        .ok_or("a storage offset that is not an integer of 0 or more")?;
        let shape = self
            .dims(&args[2])
            .ok_or("a size that is not a tuple of integers of 0 or more")?;
        let stride = self
            .dims(&args[3])
            .ok_or("a stride that is not a tuple of integers of 0 or more")?;
        let dtype = match (&storage.dtype, name) {
            (_, "_rebuild_tensor_v3") => match &args[6] {
                Val::Global(m, n) if &**m == "torch" => n.to_string(),
                _ => return Err("a dtype (argument 7) that is not a torch dtype".into()),
            },
            (Some(d), _) => d.clone(),
            (None, _) => return Err("an untyped storage and no dtype".into()),
        };
        Ok(TensorRef {
            storage: s,
            dtype,
            offset,
            shape,
            stride,
        })
    }

    /// `BINPERSID`: torch's `("storage", class, key, location, numel)`.
    fn persistent(&mut self, pid: &Val) -> VmResult<Val> {
        let items = self.items(pid);
        let (Some(Val::Str(tag)), Some(Val::Global(module, class)), Some(Val::Str(key))) =
            (items.first(), items.get(1), items.get(2))
        else {
            return Ok(Val::Opaque);
        };
        if &**tag != "storage" {
            return Ok(Val::Opaque);
        }
        let dtype = match (&**module, &**class) {
            ("torch.storage", "UntypedStorage") | ("torch", "UntypedStorage") => None,
            (_, c) => Some(storage_dtype(c)),
        };
        let numel = match items.get(4) {
            Some(Val::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        };
        // Its own copy of the key: a long key got from the memo again and
        // again is counted.
        let (key, class) = (key.to_string(), class.len());
        self.count(1 + (key.len() + class) as u64 / 32)?;
        if let Some(&first) = self.by_key.get(&key) {
            return Ok(Val::Storage(first));
        }
        self.storages.push(StorageRef {
            key: key.clone(),
            dtype,
            numel,
        });
        self.by_key.insert(key, self.storages.len() - 1);
        Ok(Val::Storage(self.storages.len() - 1))
    }

    /// The tensors under `v`, named by their keys joined with `.`, in the
    /// order they were saved.
    pub(super) fn collect(
        &self,
        v: &Val,
        name: String,
        depth: usize,
        budget: &mut u64,
        out: &mut Vec<(String, VmResult<TensorRef>)>,
    ) -> VmResult<()> {
        if depth > MAX_DEPTH {
            return Err("the saved object nests too deep".into());
        }
        // Containers may be shared (a memo got twice): a walk of a
        // structure doubled at every level would never end.
        *budget = budget
            .checked_sub(1)
            .ok_or("the saved object has too many values to walk (--index-memory)")?;
        let join = |k: &str| -> VmResult<String> {
            if name.len() + k.len() >= MAX_NAME {
                return Err(format!("a tensor name over {MAX_NAME} bytes"));
            }
            Ok(if name.is_empty() {
                k.to_string()
            } else {
                format!("{name}.{k}")
            })
        };
        match v {
            Val::Tensor(i) => {
                if let Some(t) = self.tensors.get(*i) {
                    out.push((name, t.clone()));
                }
            }
            Val::Dict(i) => {
                if let Some(Node::Dict(entries)) = self.nodes.get(*i) {
                    for (place, (k, v)) in entries.iter().enumerate() {
                        let key = self.key_name(k).unwrap_or_else(|| format!("#{place}"));
                        self.collect(v, join(&key)?, depth + 1, budget, out)?;
                    }
                }
            }
            Val::Seq(i) => {
                if let Some(Node::Seq(items)) = self.nodes.get(*i) {
                    for (k, v) in items.iter().enumerate() {
                        self.collect(v, join(&k.to_string())?, depth + 1, budget, out)?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl Vm<'_> {
    /// A dict key as a name: a string as it is, an integer in decimal,
    /// `None`, a tuple of those as Python shows it (`(1, 'a')`). `None`
    /// for any other key (a float, bytes, a bool, an object), which the
    /// caller names by its place in the dict.
    fn key_name(&self, k: &Val) -> Option<String> {
        let item = |k: &Val| match k {
            Val::Str(s) => Some(py_repr(s)),
            Val::Int(n) => Some(n.to_string()),
            Val::None => Some("None".into()),
            _ => None,
        };
        match k {
            Val::Str(s) => Some(s.to_string()),
            Val::Int(_) | Val::None => item(k),
            Val::Seq(i) => match self.nodes.get(*i) {
                Some(Node::Seq(items)) if items.len() <= 16 => {
                    let parts: Option<Vec<String>> = items.iter().map(item).collect();
                    let parts = parts?;
                    Some(match parts.len() {
                        1 => format!("({},)", parts[0]),
                        _ => format!("({})", parts.join(", ")),
                    })
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// A string as Python's `repr` shows it (quotes and escapes), for a
/// string inside a tuple key.
pub(super) fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn pairs(items: Vec<Val>) -> Vec<(Val, Val)> {
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    out
}

/// The torch dtype a typed storage class holds (`FloatStorage` →
/// `float32`); the class name less `Storage`, lower-cased, otherwise.
fn storage_dtype(class: &str) -> String {
    let named = match class {
        "DoubleStorage" => "float64",
        "FloatStorage" => "float32",
        "HalfStorage" => "float16",
        "BFloat16Storage" => "bfloat16",
        "LongStorage" => "int64",
        "IntStorage" => "int32",
        "ShortStorage" => "int16",
        "CharStorage" => "int8",
        "ByteStorage" => "uint8",
        "BoolStorage" => "bool",
        "ComplexFloatStorage" => "complex64",
        "ComplexDoubleStorage" => "complex128",
        "ComplexHalfStorage" => "complex32",
        other => return other.trim_end_matches("Storage").to_lowercase(),
    };
    named.to_string()
}
