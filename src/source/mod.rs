//! Where a catalog's bytes come from. Today a local file, mapped: the
//! data layer reads raw tensors straight out of the mapping and hands the
//! pages back once served. Formats open their files through here, so that
//! every file is opened, checked and mapped the same way.

mod local;

pub use local::{MappedFile, Span, page_size};
