//! Writes the benchmark's many-small-tensors file: N float32 tensors named
//! like a transformer checkpoint (`model.layers.L.block.K.proj.weight`), each
//! a few KiB of normally distributed values, raw little-endian.
//!
//! cargo run --release --example bench_many -- OUT.zt [N]

use ztensor_mount::formats::zt_v01::DType;
use ztensor_mount::formats::zt_v01::writer::{Options, Writer};

/// xorshift64*: fast, deterministic, good enough for benchmark weights.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Approximately N(0, sigma): the sum of four uniforms, centred.
    fn normal(&mut self, sigma: f32) -> f32 {
        let r = self.next();
        let u = |k: u32| ((r >> (k * 16)) & 0xffff) as f32 / 65536.0;
        (u(0) + u(1) + u(2) + u(3) - 2.0) * 1.732 * sigma
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let out = args.next().expect("usage: bench_many OUT.zt [N]");
    let n: usize = args.next().map_or(100_000, |s| s.parse().expect("N"));
    let tmp = format!("{out}.partial");
    let mut w = Writer::create(std::path::Path::new(&tmp))?;
    let opts = Options::default();
    let projs = [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate", "up", "down", "norm",
    ];
    let shapes: [&[u64]; 4] = [&[64], &[16, 16], &[32, 32], &[256]];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut data = Vec::new();
    for i in 0..n {
        let layer = i / 1000;
        let block = (i / projs.len()) % 125;
        let proj = projs[i % projs.len()];
        let name = format!("model.layers.{layer}.block.{block}.{proj}.weight");
        let shape = shapes[i % shapes.len()];
        let count: u64 = shape.iter().product();
        data.clear();
        for _ in 0..count {
            data.extend_from_slice(&rng.normal(0.02).to_le_bytes());
        }
        w.add(&name, DType::Float32, shape, &data, &opts)?;
    }
    w.finish()?;
    std::fs::rename(&tmp, &out)?;
    eprintln!("wrote {out} ({n} tensors)");
    Ok(())
}
