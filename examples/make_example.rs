//! Writes `examples/model.zt`, the small model the README mounts: every
//! encoding, both byte orders, a sparse matrix, checksums and custom fields.
//!
//! cargo run --example make_example [OUT]

use ciborium::value::Value;
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{Algorithm, DType, Endian};

fn f32s(n: usize, scale: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i as f32 * 0.37).sin() * scale).to_le_bytes())
        .collect()
}

fn main() -> std::io::Result<()> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "examples/model.zt".into());
    let mut w = Writer::create(std::path::Path::new(&out))?;
    let raw = Options {
        checksum: Some(Algorithm::Crc32c),
        ..Options::default()
    };
    let text = |k: &str, v: &str| (Value::Text(k.into()), Value::Text(v.into()));

    w.add(
        "embed.weight",
        DType::Float32,
        &[32, 16],
        &f32s(32 * 16, 1.0),
        &Options {
            custom: vec![
                text("description", "token embeddings"),
                (Value::Text("vocab".into()), Value::Integer(32.into())),
            ],
            ..raw.clone()
        },
    )?;
    for layer in 0..2 {
        let p = format!("enc/layer{layer}");
        // bfloat16: the top half of each float32.
        let q: Vec<u8> = f32s(16 * 16, 0.5)
            .chunks(4)
            .flat_map(|c| [c[2], c[3]])
            .collect();
        w.add(
            &format!("{p}/attn/q.weight"),
            DType::BFloat16,
            &[16, 16],
            &q,
            &raw,
        )?;
        let bias: Vec<u8> = (0..16u16)
            .flat_map(|i| (0x3c00u16 + i).to_le_bytes())
            .collect();
        w.add(
            &format!("{p}/attn/q.bias"),
            DType::Float16,
            &[16],
            &bias,
            &raw,
        )?;
        w.add(
            &format!("{p}/mlp/w1"),
            DType::Float32,
            &[64, 64],
            &f32s(64 * 64, 0.1),
            &Options {
                compression: Compression::Zstd {
                    level: 3,
                    frame_size: 4096,
                },
                checksum: Some(Algorithm::Sha256),
                ..Options::default()
            },
        )?;
    }
    w.add(
        "norm.scale",
        DType::Float32,
        &[16],
        &f32s(16, 2.0),
        &Options {
            endian: Endian::Big,
            ..raw.clone()
        },
    )?;
    w.add("step", DType::Int64, &[], &1234i64.to_le_bytes(), &raw)?;
    w.add("mask", DType::Bool, &[8], &[1, 0, 1, 1, 0, 0, 1, 0], &raw)?;
    let values: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    w.add_csr(
        "graph.adjacency",
        DType::Float32,
        [4, 4],
        &[0, 1, 2, 3, 4],
        &[1, 2, 3, 0],
        &values,
        &raw,
    )?;
    w.finish()?;
    eprintln!("wrote {out}");
    Ok(())
}
