//! Views: extra files computed from the catalog so that libraries open a
//! mounted tensor by its path alone. Each is a small generated header (or
//! none) followed by a tensor's exposed bytes, served through the same data
//! path as the tensor's own file: no second copy, no extra decode.
//!
//! - `.npy/PATH.npy`: numpy's format (`np.load`, with or without mmap).
//! - `.zarr/`: a zarr v3 group mirroring the tree; each dense tensor is an
//!   array of one chunk (`PATH/zarr.json`, `PATH/c/0/…`), for TensorStore
//!   and zarr-python.
//! - `.safetensors/model.safetensors`: one safetensors file of every dense
//!   tensor whose type safetensors has.
//!
//! They sit in hidden top-level directories, so `ls MOUNT` shows the model
//! as it is; `--views` chooses which are made.

pub mod npy;
pub mod safetensors;
pub mod zarr;

/// Which views a mount makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Views {
    pub npy: bool,
    pub zarr: bool,
    pub safetensors: bool,
}

impl Default for Views {
    fn default() -> Self {
        Views::ALL
    }
}

impl Views {
    pub const ALL: Views = Views {
        npy: true,
        zarr: true,
        safetensors: true,
    };
    pub const NONE: Views = Views {
        npy: false,
        zarr: false,
        safetensors: false,
    };

    /// Parses `npy,zarr,safetensors`, `all` or `none`.
    pub fn parse(list: &str) -> Result<Views, String> {
        let mut v = Views::NONE;
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "all" => v = Views::ALL,
                "none" => v = Views::NONE,
                "npy" => v.npy = true,
                "zarr" => v.zarr = true,
                "safetensors" => v.safetensors = true,
                other => {
                    return Err(format!(
                        "unknown view {other:?} (views: npy, zarr, safetensors, all, none)"
                    ));
                }
            }
        }
        Ok(v)
    }
}

/// The hidden top-level directory of each view.
pub const NPY_DIR: &str = ".npy";
pub const ZARR_DIR: &str = ".zarr";
pub const SAFETENSORS_DIR: &str = ".safetensors";
pub const SAFETENSORS_FILE: &str = "model.safetensors";
